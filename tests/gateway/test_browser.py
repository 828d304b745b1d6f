"""CORS with a real browser (T70-T72 in spirit): Debian's chromium, driven
by Python playwright with executable_path (never a downloaded browser),
loads a page from another loopback port and talks to the gateway the way
the OpenAI JS SDK does (Authorization plus x-stainless-* headers, so every
request needs a preflight). SKIPs without /usr/bin/chromium or playwright.
"""
import http.server
import os
import shutil
import threading
import time

import pytest

from gwharness import Stack, fake_msg

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pw = pytest.importorskip("playwright.sync_api", reason="pip package playwright not installed")
if not os.path.exists(CHROMIUM):
    pytest.skip("Debian package chromium not installed", allow_module_level=True)

SDK_HEADERS = {
    "content-type": "application/json", "authorization": "Bearer sk-dummy", "accept": "application/json",
    "x-stainless-arch": "x64", "x-stainless-lang": "js", "x-stainless-os": "Linux",
    "x-stainless-package-version": "6.49.0", "x-stainless-retry-count": "0",
    "x-stainless-runtime": "browser:chrome", "x-stainless-runtime-version": "156",
}

STREAM_JS = """
async ({url, headers, body}) => {
  const r = await fetch(url, {method: 'POST', headers, body: JSON.stringify(body)});
  const reader = r.body.getReader(), dec = new TextDecoder();
  let raw = '', events = 0;
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    raw += dec.decode(value, {stream: true});
    events++;
  }
  let text = '';
  for (const ev of raw.split('\\n\\n')) {
    if (ev.startsWith('data: ') && ev !== 'data: [DONE]')
      text += JSON.parse(ev.slice(6)).choices[0]?.delta?.content ?? '';
  }
  return {status: r.status, text, rid: r.headers.get('x-request-id'), reads: events};
}
"""

ABORT_JS = """
async ({url, headers, body}) => {
  const ac = new AbortController();
  const r = await fetch(url, {method: 'POST', headers, body: JSON.stringify(body), signal: ac.signal});
  const reader = r.body.getReader();
  await reader.read();
  ac.abort();
  try { await reader.read(); } catch (e) {}
  return r.status;
}
"""

PLAIN_JS = """
async ({url}) => {
  const r = await fetch(url, {method: 'POST', headers: {'content-type': 'text/plain'},
                              body: '{"model":"m","messages":[{"role":"user","content":"hi"}]}'});
  return r.status;
}
"""


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("page")
    (d / "index.html").write_text("<!doctype html><title>k3 gateway CORS test</title>")

    class H(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(d), **kw)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()


def test_browser_cors_stream_abort_and_simple_request(page_server):
    with Stack(gw_args=["--cors", page_server]) as s, pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = b.new_page()
            page.goto(page_server + "/index.html")
            url = s.base + "/v1/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            out = page.evaluate(STREAM_JS, {"url": url, "headers": SDK_HEADERS, "body": body})
            assert out["status"] == 200 and out["text"] == "Hello from fake k3d."
            assert out["rid"].startswith("req_")            # readable: exposed by CORS
            # abort mid-stream frees the slot (T71 + T63)
            slow = dict(body, messages=fake_msg({"tokens": ["t"] * 300, "delay": 0.02}))
            for _ in range(3):
                assert page.evaluate(ABORT_JS, {"url": url, "headers": SDK_HEADERS, "body": slow}) == 200
                end = time.time() + 3
                while True:
                    out = page.evaluate(STREAM_JS, {"url": url, "headers": SDK_HEADERS, "body": body})
                    if out["status"] != 429 or time.time() > end:
                        break
                    time.sleep(0.05)
                assert out["status"] == 200
            assert sum(1 for e in s.fake.events("cancel") if e["matched"]) == 3
            # a cross-site "simple request" (no preflight) starts nothing (T72)
            n = len(s.fake.events("generate"))
            assert page.evaluate(PLAIN_JS, {"url": url}) == 415
            assert len(s.fake.events("generate")) == n
        finally:
            b.close()
