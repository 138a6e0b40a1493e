"""What the emulated API answers when things go wrong, copied from Lambda: its error codes and messages (ERRORS), the
faults a test can switch on (FAULTS: slow answers, a dropped answer, an nginx page, 5xx...), and the exceptions the
account raises for the HTTP layer to turn into answers."""
from __future__ import annotations


# (HTTP status, code, message, suggestion) as in the OpenAPI file's ApiError* schemas (their defaults)
ERRORS = {
    "invalid-api-key": (401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                        "Check your API key or create a new one, then try again."),
    "account-inactive": (403, "global/account-inactive", "Your account is inactive.",
                         "Make sure you have verified your email address and have a valid payment method. "
                         "Contact Support if problems continue."),
    "instance-not-found": (404, "global/object-does-not-exist", "Specified instance does not exist.", None),
    "invalid-parameters": (400, "global/invalid-parameters", "Invalid request data.", None),
    "insufficient-capacity": (400, "instance-operations/launch/insufficient-capacity",
                              "Not enough capacity to fulfill launch request.", None),
    "quota-exceeded": (400, "global/quota-exceeded", "Quota exceeded.", "Contact Support to increase your quota."),
    "launch-resource-not-found": (404, "global/object-does-not-exist", "Specified SSH key does not exist.",
                                  "Check the name of the SSH key, or add it first."),
    "launch-fs-not-found": (404, "global/object-does-not-exist", "Specified filesystem does not exist.",
                            "Check the name or id of the filesystem, or create it first."),
    "filesystem-not-found": (404, "global/object-does-not-exist", "Filesystem was not found.", None),
    "filesystem-in-use": (400, "filesystems/filesystem-in-use", "Filesystem is in use by an instance.", None),
    "duplicate": (400, "global/duplicate", "A filesystem with this name already exists.", None),
    "fs-wrong-region": (400, "instance-operations/launch/file-system-in-wrong-region",
                        "File system is in a different region than the instance.",
                        "Launch the instance in the filesystem's region, or attach a filesystem in the instance's "
                        "region."),
    "internal-error": (500, "global/internal-error", "An internal server error occurred.",
                       "Try again later. Contact Support if the problem persists."),
    "unknown": (500, "global/unknown", "An unknown error occurred.", "Try again later."),  # seen live on terminate
    "not-found": (404, "global/object-does-not-exist", "Not found.", None),
    "too-many-requests": (429, "global/too-many-requests", "Too many requests.", "Wait and try again."),
}

# faults: name -> what it does (a fault with times=N fires N times, then clears; times=None: until cleared)
FAULTS = {
    "5xx": "the next matching request (path= substring, default every API path) answers 500 global/internal-error "
           "(error=unknown: global/unknown, as seen live on terminate)",
    "slow-answer": "matching requests (path= substring) wait seconds= (default 3) before they are carried out",
    "slow-launch-answer": "a launch creates the instance, then answers only after seconds= (default 10)",
    "null-data": "matching requests (path= substring) answer 200 with {\"data\": null}",
    "no-price": "GET /instance-types lists type= (default every type) without price_cents_per_hour",
    "key-added-elsewhere": "the next POST /ssh-keys meets the same key, registered under the same name a moment "
                           "before by another client (refused as a duplicate)",
    "recycle-ip": "the next instance launched gets the address of the instance that ended last (address= to choose "
                  "it): Lambda hands a freed IP to a new machine",
    "launch-5xx-after-create": "a launch creates the instance, then answers 500 (an ambiguous failure)",
    "drop-launch-response": "a launch creates the instance, then closes the connection without an answer",
    "slow-boot": "instances launched while set boot in seconds= (default 60) instead of boot_seconds",
    "preempt-while-booting": "instances launched while set become `preempted` after seconds= (default 0.3)",
    "quota-exceeded": "launches answer 400 global/quota-exceeded",
    "account-inactive": "every API request answers 403 global/account-inactive",
    "revoked-key": "the key is revoked: after= (default 0) requests answered as usual, every later request (path= "
                   "substring) answers 401 global/invalid-api-key",
    "ignore-user-data-host-key": "instance hosts present a generated host key instead of user_data's",
    "unhealthy": "instances launched while set become `unhealthy` instead of `active`",
    "old-driver": "instances launched while set run NVIDIA driver version= (default 535.183.01, CUDA 12.2), as an "
                  "instance from an older image does",
    "proxy-page": "the next matching request (path= substring) is answered by a proxy in front of the API, before the "
                  "key is checked: HTTP status= (default 502) with nginx's HTML error page, not Lambda's JSON",
}
ONCE_BY_DEFAULT = {"5xx", "launch-5xx-after-create", "drop-launch-response", "proxy-page", "slow-launch-answer",
                   "key-added-elsewhere", "recycle-ip"}
# the titles of nginx's own error pages (what a reverse proxy in front of an API answers)
NGINX_TITLES = {401: "401 Authorization Required", 403: "403 Forbidden", 404: "404 Not Found", 407: "407 Proxy "
                "Authentication Required", 502: "502 Bad Gateway", 503: "503 Service Temporarily Unavailable",
                504: "504 Gateway Time-out"}


class ApiError(Exception):
    def __init__(self, kind: str, message: str | None = None, headers: dict | None = None):
        status, code, default, suggestion = ERRORS[kind]
        self.status = status
        self.body = {"code": code, "message": message or default}
        if suggestion:
            self.body["suggestion"] = suggestion
        self.headers = headers or {}
        super().__init__(code)


class _Drop(Exception):
    """Close the connection without an answer."""


class _Delayed(Exception):
    """The request was carried out; its answer leaves only after `seconds` (slept outside the emulator's lock)."""

    def __init__(self, status: int, doc, seconds: float):
        super().__init__("delayed")
        self.status, self.doc, self.seconds = status, doc, seconds
