"""Browser egress: an episode reaches its start URL's host, loopback and the hosts `allowed_hosts` names;
private, link-local and other hosts are blocked in the browser and reported as `Error:` observations."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from envs.browser.egress import Egress
from flows.cli import app

# Never contacted: the browser blocks them before any connection (documentation and private ranges).
PRIVATE = "http://10.255.255.1/admin"
METADATA = "http://169.254.169.254/latest/meta-data/"
PUBLIC = "http://203.0.113.7/page"  # TEST-NET-3: a public-looking address nobody serves

PAGE = f"""<!doctype html><html><head><title>Egress</title></head><body>
<h1>Start</h1>
<a href="{METADATA}">metadata</a>
<a href="second.html">second</a>
<img src="{PRIVATE}/pixel.png" alt="">
<script>fetch("{PUBLIC}").catch(() => {{}});</script>
</body></html>"""


def test_egress_rules() -> None:
    async def main() -> None:
        egress = Egress(["shop.example", "*.cdn.example", "192.168.7.0/24"], ["http://127.0.0.1:8123/index.html"])
        assert await egress.check("http://127.0.0.1:8123/x") is None and await egress.check("http://localhost/") is None
        assert await egress.check("https://shop.example/a") is None and await egress.check("https://a.cdn.example/b") is None
        assert await egress.check("http://192.168.7.9/") is None and await egress.check("data:text/plain,hi") is None
        for blocked in (PRIVATE, METADATA, PUBLIC, "https://other.example/", "http://192.168.8.1/", "file:///etc/passwd"):
            assert await egress.check(blocked) is not None, blocked
        anywhere = Egress(["*"])
        assert await anywhere.check("http://93.184.216.34/") is None  # any public host (only checked, never opened)
        assert await anywhere.check(PUBLIC) is not None  # a documentation range is not public
        assert "not an allowed host" in (await anywhere.check(PRIVATE) or "")  # never a private one, unless named
        assert "not an allowed host" in (await anywhere.check(METADATA) or "")
        with pytest.raises(ValueError, match="empty entry"):
            Egress([""])

    asyncio.run(main())


def test_envs_check_reports_blocked_navigation_and_requests_as_errors(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE)
    (site / "second.html").write_text("<!doctype html><title>Second</title><p>Second page</p>")
    task = {"id": "egress", "start_url": "index.html", "instruction": "Open the second page.",
            "evaluation": {"type": "url", "contains": "second.html"},
            # The reference tries the private host, then the metadata link, then does the task.
            "solution": [{"name": "goto", "arguments": {"url": PRIVATE}},
                         {"name": "click", "arguments": {"bid": "BID"}},
                         {"name": "goto", "arguments": {"url": "second.html"}}],
            "metadata": {"probes": 2}}
    config = {"env": "browser", "env_config": {"site_dir": str(site), "observe": ["axtree"], "step_timeout_s": 15},
              "tasks": {"source": "sites", "path": str(tmp_path / "tasks.jsonl")}}

    # The metadata link's element id, as the agent would read it.
    async def link_bid() -> str:
        from envs.base import Task
        from envs.browser.env import BrowserEnv

        async with BrowserEnv(site_dir=str(site), observe=["axtree"]) as env:
            page = await env.reset(Task(id="x", env="browser", instruction="x", params={"start_url": "index.html"}))
            line = next(line for line in page[-1].axtree.splitlines() if "link 'metadata'" in line)
            return line.split("[")[1].split("]")[0]

    task["solution"][1]["arguments"]["bid"] = asyncio.run(link_bid())
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    (tmp_path / "browser.yaml").write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(app, ["envs", "check", "--config", str(tmp_path / "browser.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["reference"]["passed"] == 1 and report["tool_errors"] == 0
    errors = {e["index"]: e["error"] for e in report["reference_error_calls"]}
    assert errors[0] == f"cannot open {PRIVATE}: 10.255.255.1 is not an allowed host of this task (env_config.allowed_hosts)"
    assert errors[1].startswith(f"the page tried to open {METADATA}: 169.254.169.254 is not an allowed host")


def test_webrtc_sends_no_udp_around_the_allowlist(tmp_path: Path) -> None:
    """A page's RTCPeerConnection to a STUN server (a UDP listener here) gathers no candidate and sends nothing."""
    from envs.base import Task
    from envs.browser.env import BrowserEnv

    stun = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stun.bind(("127.0.0.1", 0))
    stun.setblocking(False)
    port = stun.getsockname()[1]
    (tmp_path / "index.html").write_text(f"""<!doctype html><title>rtc</title><p>calling</p><script>
window.gathered = (async () => {{
  const pc = new RTCPeerConnection({{iceServers: [{{urls: "stun:127.0.0.1:{port}"}}]}});
  const found = [];
  pc.onicecandidate = (e) => {{ if (e.candidate && e.candidate.candidate) found.push(e.candidate.candidate); }};
  pc.createDataChannel("leak");
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {{
    if (pc.iceGatheringState === "complete") done();
    pc.onicegatheringstatechange = () => {{ if (pc.iceGatheringState === "complete") done(); }};
    setTimeout(done, 4000);
  }});
  pc.close();
  return found;
}})();
</script>""")
    task = Task(id="rtc", env="browser", instruction="Wait.", params={"start_url": "index.html"},
                goal={"evaluation": [{"type": "js", "expression": "window.gathered.then(c => c.length === 0 ? 1 : 0)"}]})

    async def main() -> str:
        async with BrowserEnv(site_dir=str(tmp_path), observe=["axtree"]) as env:
            await env.reset(task)
            verdict = await env.evaluate()
            return verdict.reason if not verdict.success else ""

    try:
        failed = asyncio.run(main())
        packets = []
        while True:
            try:
                packets.append(stun.recvfrom(2048))
            except BlockingIOError:
                break
    finally:
        stun.close()
    assert packets == [], f"{len(packets)} UDP packet(s) reached the STUN listener"
    assert failed == "", failed  # no host, srflx or relay candidate was gathered
