"""A local Lambda Cloud API emulator (`gpuops sandbox up --cloud`): server.py (`Emulator`: the account's state and
its knobs), routes.py (the API's paths), hosts.py (instances as sandbox hosts), httpd.py (the HTTP layer), faults.py
(Lambda's errors and the faults a test switches on), daemon.py (run it in the background across processes),
catalog.py (instance types, regions, images)."""
