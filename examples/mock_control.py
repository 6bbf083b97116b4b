"""What the SDK test scripts share (stdlib only): the control API of
`switchyard mock-upstream` (set a fault, read and clear the request log), the
command line, and the loop that runs the checks."""

import argparse
import json
import sys
import traceback
import urllib.request


class Mock:
    """One mock-upstream, by its base URL (`http://HOST:PORT`)."""

    def __init__(self, url):
        self.url = url.rstrip("/")

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read()
        return json.loads(text) if text.strip() else None

    def fault(self, spec):
        self._call("PUT", "/_mock/faults", spec)

    def tools(self, script):
        """How tool calls are answered: `{"name", "arguments", "text_after_result"}`."""
        self._call("PUT", "/_mock/tools", script)

    def config(self, patch):
        self._call("PUT", "/_mock/config", patch)

    def requests(self):
        return self._call("GET", "/_mock/requests")

    def clear(self):
        self.fault({})
        self.tools({})
        self._call("DELETE", "/_mock/requests")


def arguments(description, base_url_help):
    """The SDK scripts' command line: the door's base URL and the two mocks."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base-url", required=True, help=base_url_help)
    p.add_argument("--primary", required=True, help="primary mock-upstream URL")
    p.add_argument("--secondary", required=True, help="secondary mock-upstream URL")
    p.add_argument("--api-key", default="unused-in-open-mode")
    return p.parse_args()


def run_checks(checks, client, args):
    """Runs every check (each takes client, primary, secondary), printing one
    PASS/FAIL line each; returns the exit code (1 if any failed)."""
    primary, secondary = Mock(args.primary), Mock(args.secondary)
    failed = 0
    for check in checks:
        try:
            check(client, primary, secondary)
            print(f"PASS {check.__name__}")
        except Exception:  # noqa: BLE001 - report every check
            failed += 1
            print(f"FAIL {check.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"sdk checks: {len(checks) - failed} ok, {failed} failed")
    return 1 if failed else 0
