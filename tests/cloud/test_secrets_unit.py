"""The pure parts of #21's secrets fixes: what a key may hold, how an answer that is not Lambda's is read, what is
scrubbed. The same paths end to end: tests/cloud/test_secrets_e2e.py."""
from __future__ import annotations

import pytest

from gpuops.cloud import api
from gpuops.errors import ExitCode

NGINX_401 = ("<html>\r\n<head><title>401 Authorization Required</title></head>\r\n<body>\r\n<center><h1>401 "
             "Authorization Required</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")


@pytest.mark.parametrize("key,problem", [
    ("secret_abc.def", None),
    ("", "it is empty"),
    ("abc\ndef", "it holds a line break (\\n) at character 4 of 7"),
    ("abc\rdef", "it holds a carriage return (\\r) at character 4 of 7"),
    ("abc def", "it holds a space at character 4 of 7"),
    ("ab\x1b[2Jc", "it holds a control character (U+001B) at character 3 of 7"),
    ("\ufeffabc", "it holds a non-ASCII character (U+FEFF) at character 1 of 4"),
])
def test_key_problem_names_the_character_and_place_never_the_key(key, problem):
    assert api.key_problem(key) == problem


@pytest.mark.parametrize("status,code,transient,words", [
    (401, ExitCode.CONNECTION, False, "Unauthorized, text/html \"401 Authorization Required\""),
    (403, ExitCode.CONNECTION, False, "Forbidden, text/html"),
    (407, ExitCode.CONNECTION, False, "Proxy Authentication Required, text/html"),
    (404, ExitCode.FAILED, False, "Not Found, text/html"),
    (418, ExitCode.FAILED, False, "I'm a Teapot, text/html"),
    (502, ExitCode.FAILED, True, "Bad Gateway, text/html"),
])
def test_an_answer_that_is_not_lambdas_gets_its_statuss_code(status, code, transient, words):
    page = NGINX_401.replace("401 Authorization Required", f"{status} page") if status != 401 else NGINX_401
    err = api.error_from_response(status, None, {"content-type": "text/html; charset=utf-8"}, "GET", "/instances", page)
    assert err.code == code and err.transient == transient and not err.not_found, err.message
    assert "not an answer of Lambda's API: " + words in err.message and f"HTTP {status}" in err.message
    assert err.hint and "\r" not in err.message and "\n" not in err.message


def test_a_json_body_without_lambdas_error_shape_is_foreign_too_and_a_redirect_says_where():
    err = api.error_from_response(401, {"message": "Unauthorized"}, {"content-type": "application/json"}, "GET", "/x")
    assert err.code == ExitCode.CONNECTION and "not an answer of Lambda's API" in err.message
    r = api.error_from_response(302, None, {"location": "https://portal.example/login"}, "GET", "/instances")
    assert r.code == ExitCode.FAILED and "redirects to https://portal.example/login" in r.hint


def test_only_lambdas_own_code_means_not_found():
    lam = api.error_from_response(404, {"error": {"code": "global/object-does-not-exist", "message": "gone"}}, {},
                                  "GET", "/instances/{id}")
    assert lam.not_found
    assert not api.error_from_response(404, None, {}, "GET", "/instances/{id}", "<html>404</html>").not_found


def test_a_page_snippet_is_one_short_line_without_control_characters():
    text = "<html><body>" + "\x1b]0;pwned\x07 line\nnext " * 40 + "</body></html>"
    msg = api.foreign_answer(500, {"content-type": "text/html"}, text)
    assert "\x1b" not in msg and "\x07" not in msg and "\n" not in msg and msg.endswith('..."')
    assert len(msg.split('"', 1)[1]) <= 82


def test_short_stand_ins_are_not_scrubbed_out_of_ordinary_words():
    api.Secret("k")
    assert api.redact("unknown key kind") == "unknown key kind"
