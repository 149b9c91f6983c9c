"""The wheel as a user installs it: built from this checkout, installed into a fresh virtualenv
once without extras and once with each of ``agents``, ``console``, ``mcp`` and ``otlp`` (from
PyPI, so the extras' declared dependencies are what is tested, not this checkout's
environment).

In each: the wheel's contents are what docs/install.md says, every module imports unless it
belongs to an extra that is not installed (and then says which one to install), the
``toolfleet`` command and its entry points run, and each extra's part works.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from kernel.adapters.redis import connect_redis
from kernel.settings import Settings
from kernel.stores.keys import Keys
from tests.docs.readme import run_readme
from tests.integration.test_otlp_export import Receiver

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
PROBE = Path(__file__).with_name("probe.py")
PACKAGES = ("schemas", "kernel", "planner", "executors", "aggregator", "reconciler", "toolfleet")
EXTRA_SETS = ("", "agents", "console", "mcp", "otlp")

# The top-level modules each extra brings, as a missing one is named in an ImportError (one
# module may come with several: the agents extra brings the mcp package too).
EXTRA_MODULES = {
    "agents": {"agents", "openai", "mcp"},
    "console": {"starlette", "uvicorn", "sse_starlette", "authlib", "joserfc", "httpx"}
    | {"itsdangerous"},
    "mcp": {"mcp", "mcp_types", "jwt"},
    "sim": {"fakeredis", "lupa"},
    "otlp": {"opentelemetry.exporter", "google", "requests"},
}
# Where each extra's modules live in toolfleet: nothing else may need them.
EXTRA_HOMES = {
    "agents": "toolfleet.agents",
    "console": "toolfleet.app.console.",
    "mcp": "toolfleet.app.mcp.",
    "sim": "toolfleet.testing.sim",
}


def _install_hint(extra: str) -> str:
    return f"pip install 'toolfleet[{extra}]'"


@dataclass(frozen=True)
class Venv:
    """A fresh virtualenv holding the wheel installed with ``extra`` ('' for none)."""

    path: Path
    extra: str

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def env(self, **more: str) -> dict[str, str]:
        """The environment a user of this virtualenv has: its bin first on PATH, nothing of
        this checkout's (no PYTHONPATH, no VIRTUAL_ENV of the dev one)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(self.path))
        env.update(more)
        return env

    def run(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ``args`` (a command of this virtualenv's bin) outside the checkout."""
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]], env=self.env(**env), cwd=self.path,
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def probe(self) -> dict[str, Any]:
        """What imports here (tests/packaging/probe.py's report)."""
        done = self.run("python", str(PROBE))
        assert done.returncode == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        assert report["prefix"] == str(self.path)
        return report


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built as a release would build it."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("toolfleet-*.whl")
    return built


@pytest.fixture(scope="module")
def venvs(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Venv]:
    """One fresh virtualenv per extra set, installed side by side: pip mostly waits on PyPI,
    so the four at once took 14-30 s here against about 50 s one after another."""
    root = tmp_path_factory.mktemp("venvs")

    def create(extra: str) -> Venv:
        venv = Venv(root / (extra or "none"), extra)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv.path)], check=True)
        requirement = f"toolfleet[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venv.bin / "python"), "install",
             "-q", "--disable-pip-version-check", requirement],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"pip install {requirement}:\n{done.stderr}"
        return venv

    with ThreadPoolExecutor(len(EXTRA_SETS)) as pool:
        return {venv.extra: venv for venv in pool.map(create, EXTRA_SETS)}


@pytest.fixture(scope="module")
def probes(venvs: dict[str, Venv]) -> dict[str, dict[str, Any]]:
    """Each virtualenv's probe report."""
    with ThreadPoolExecutor(len(venvs)) as pool:
        return dict(zip(venvs, pool.map(Venv.probe, venvs.values()), strict=True))


# -- the wheel ------------------------------------------------------------------------------


def _documented_packages() -> list[str]:
    """The packages docs/install.md's "What the wheel holds" table lists."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text.split("## What the wheel holds", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)/` \|", section, flags=re.MULTILINE)


def _source_files() -> set[str]:
    """Every file of the packages in this checkout, as the wheel should carry it."""
    found = set()
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_the_wheel_holds_the_documented_packages_and_nothing_else(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    meta = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    tops = sorted({n.split("/")[0] for n in names - meta})
    assert tops == sorted(_documented_packages()) == sorted(PACKAGES)
    for top in PACKAGES:  # typed: mypy users type-check against every package
        assert f"{top}/py.typed" in names
    static = {n for n in names if n.startswith("toolfleet/app/console/static/")}
    assert {"index.html", "console.js", "console.css"} <= {n.rsplit("/", 1)[1] for n in static}
    assert len([n for n in names if n.startswith("schemas/json/")]) >= 10
    assert names - meta == _source_files()  # every source file, no test, bench or cache
    assert not [n for n in names if n.endswith((".pyc", ".pyo")) or "/tests/" in f"/{n}"]


def test_the_wheel_declares_the_documented_extras_and_the_command(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        dist_info = next(n.split("/")[0] for n in archive.namelist() if ".dist-info/" in n)
        metadata = Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"agents", "console", "mcp", "otlp", "containers", "all"} <= extras
    docs = (ROOT / "docs" / "install.md").read_text()
    for extra in ("agents", "console", "mcp", "otlp", "containers", "sim", "all"):
        assert f"toolfleet[{extra}]" in docs, f"docs/install.md does not mention [{extra}]"
    base = [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    heavy = ("openai-agents", "starlette", "uvicorn", "sse-starlette", "authlib", "exporter", "mcp")
    assert not [r for r in base if r.startswith(heavy)], base
    assert "toolfleet = toolfleet.app.cli:main" in entry_points


# -- what imports, in each virtualenv --------------------------------------------------------


def _extras_of(missing: str | None) -> list[str]:
    """The extras that bring the module an ImportError names."""
    return [
        extra
        for extra, modules in EXTRA_MODULES.items()
        if missing and any(missing == m or missing.startswith(f"{m}.") for m in modules)
    ]


@pytest.mark.parametrize("extra", EXTRA_SETS, ids=lambda e: e or "none")
def test_every_module_imports_but_those_of_an_extra_not_installed(
    extra: str, probes: dict[str, dict[str, Any]]
) -> None:
    report = probes[extra]
    failed = {name: why for name, why in report["modules"].items() if why is not None}
    for name, why in failed.items():
        needs = [e for e in _extras_of(why["missing"]) if e != extra]
        assert needs, f"{name} fails to import: {why}"
        homes = [EXTRA_HOMES[e] for e in needs if e in EXTRA_HOMES]
        assert any(name.startswith(h) for h in homes), f"{name} needs {needs}: {why}"
    services = ("planner.service", "executors.worker", "aggregator.service", "reconciler.service")
    for name in (*services, "toolfleet.client", "toolfleet.testing", "toolfleet.app.cli"):
        assert name in report["modules"] and report["modules"][name] is None
    if extra == "agents":
        assert not [n for n in failed if n.startswith("toolfleet.agents")]
    if extra == "console":
        assert not [n for n in failed if n.startswith("toolfleet.app.console")]
    if extra == "mcp":
        assert not [n for n in failed if n.startswith("toolfleet.app.mcp")]


@pytest.mark.parametrize("extra", EXTRA_SETS, ids=lambda e: e or "none")
def test_fleet_runner_imports_with_the_agents_extra_and_says_how_to_get_it_without(
    extra: str, probes: dict[str, dict[str, Any]]
) -> None:
    failure = probes[extra]["fleet_runner"]
    if extra == "agents":
        assert failure is None
        return
    assert failure is not None
    assert failure["type"] == "MissingExtraError", failure
    assert failure["import_error"] and failure["toolfleet_error"]
    assert _install_hint("agents") in failure["message"]


@pytest.mark.parametrize("extra", EXTRA_SETS, ids=lambda e: e or "none")
def test_the_console_application_imports_with_its_extra_and_says_how_to_get_it_without(
    extra: str, probes: dict[str, dict[str, Any]]
) -> None:
    failure = probes[extra]["create_app"]
    if extra == "console":
        assert failure is None
        return
    assert failure is not None
    assert failure["type"] == "MissingExtraError", failure
    assert _install_hint("console") in failure["message"]


@pytest.mark.parametrize("extra", EXTRA_SETS, ids=lambda e: e or "none")
def test_the_mcp_door_imports_with_its_extra_and_says_how_to_get_it_without(
    extra: str, probes: dict[str, dict[str, Any]]
) -> None:
    failure = probes[extra]["mcp_app"]
    if extra in ("mcp", "agents"):  # the agents extra brings the mcp package (and PyJWT)
        assert failure is None
        return
    assert failure is not None
    assert failure["type"] == "MissingExtraError", failure
    assert _install_hint("mcp") in failure["message"]


def test_no_extra_installs_another_s_optional_part(probes: dict[str, dict[str, Any]]) -> None:
    base = set(probes[""]["distributions"])
    assert not {"openai-agents", "starlette", "uvicorn", "authlib", "mcp"} & base
    assert "opentelemetry-exporter-otlp-proto-http" not in base
    assert "openai-agents" not in probes["console"]["distributions"]
    assert "authlib" not in probes["agents"]["distributions"]
    assert not {"openai-agents", "authlib"} & set(probes["mcp"]["distributions"])


# -- the command -----------------------------------------------------------------------------


@pytest.mark.parametrize("extra", EXTRA_SETS, ids=lambda e: e or "none")
def test_the_command_and_its_help_run_in_every_install(extra: str, venvs: dict[str, Venv]) -> None:
    venv = venvs[extra]
    for args in (
        ("toolfleet", "--help"),
        ("toolfleet", "console", "--help"),
        ("toolfleet", "mcp", "--help"),
        ("toolfleet", "worker", "--help"),
        ("python", "-m", "toolfleet", "--help"),
    ):
        done = venv.run(*args)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
        assert "Usage:" in done.stdout


def _one_line_error(done: subprocess.CompletedProcess[str], extra: str) -> None:
    """The command ended with one line naming the extra, and no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and _install_hint(extra) in errors[0], done.stderr


@pytest.mark.parametrize("extra", ["", "agents", "otlp"], ids=lambda e: e or "none")
def test_the_console_command_without_its_extra_names_the_extra(
    extra: str, venvs: dict[str, Venv]
) -> None:
    _one_line_error(venvs[extra].run("toolfleet", "console", "--port", "0"), "console")


@pytest.mark.parametrize("extra", ["", "console", "otlp"], ids=lambda e: e or "none")
def test_the_mcp_command_without_its_extra_names_the_extra(
    extra: str, venvs: dict[str, Venv]
) -> None:
    _one_line_error(venvs[extra].run("toolfleet", "mcp", "--port", "0"), "mcp")


def test_otlp_traces_without_the_extra_name_the_extra(venvs: dict[str, Venv]) -> None:
    # The tracer is set up before any connection is made: no broker needed to see this.
    done = venvs[""].run("toolfleet", "planner", TOOLFLEET_TRACES="otlp")
    _one_line_error(done, "otlp")


def test_otlp_traces_with_the_extra_reach_a_collector(venvs: dict[str, Venv]) -> None:
    receiver = Receiver()  # an OTLP/HTTP endpoint, as a collector serves it
    script = (
        "from opentelemetry import trace\n"
        "from kernel.adapters.tracing import configure_tracing\n"
        "from kernel.settings import Settings\n"
        "provider = configure_tracing('packaging', Settings(traces='otlp'))\n"
        "with trace.get_tracer('packaging').start_as_current_span('installed'):\n"
        "    pass\n"
        "provider.shutdown()\n"  # exports what is queued, waiting for the receiver's answer
    )
    try:
        done = venvs["otlp"].run(
            "python", "-c", script, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint
        )
        assert done.returncode == 0, done.stderr
        with receiver.lock:
            received = [(service, name) for service, name, _, _ in receiver.spans]
        assert received == [("toolfleet-packaging", "installed")]
    finally:
        receiver.server.shutdown()


# -- the services and the console, running against the real Kafka and Redis -----------------


@pytest.fixture
async def fleet_env(settings: Settings) -> AsyncIterator[dict[str, str]]:
    """Where the real Kafka and Redis are, and a namespace no earlier run has used (topics
    and keys as on day one, made by the processes themselves), deleted afterwards."""
    fresh = settings.model_copy(update={"topic_prefix": f"pkg-{uuid.uuid4().hex[:8]}."})
    yield {
        "KAFKA_BOOTSTRAP_SERVERS": fresh.kafka_servers(),
        "REDIS_URL": fresh.redis_address(),
        "TOOLFLEET_TOPIC_PREFIX": fresh.topic_prefix,
    }
    admin = AIOKafkaAdminClient(bootstrap_servers=fresh.kafka_servers())
    await admin.start()
    try:
        made = [t for t in await admin.list_topics() if t.startswith(fresh.topic_prefix)]
        if made:
            await admin.delete_topics(made)
    finally:
        await admin.close()
    redis = connect_redis(fresh)
    try:
        pattern = f"{Keys.of(fresh).namespace}:*"
        for key in [key async for key in redis.scan_iter(match=pattern, count=1000)]:
            await redis.unlink(key)  # one key per command: any slot
    finally:
        await redis.aclose()


@pytest.mark.integration
def test_the_demo_runs_the_services_without_any_extra(
    venvs: dict[str, Venv], fleet_env: dict[str, str]
) -> None:
    done = venvs[""].run(
        "toolfleet", "demo", timeout=180, TOOLFLEET_DECISION_AUTH="off", **fleet_env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"status": "completed"' in done.stdout
    assert "Traceback" not in done.stderr, done.stderr


@pytest.fixture
def console_process(venvs: dict[str, Venv], fleet_env: dict[str, str]) -> Iterator[str]:
    """``toolfleet console`` of the console virtualenv, serving; yields its URL."""
    venv = venvs["console"]
    process = subprocess.Popen(
        [str(venv.bin / "toolfleet"), "console", "--port", "0"], env=venv.env(**fleet_env),
        cwd=venv.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in process.stdout or ()])
    reader.start()  # ends with the process: its stdout closes
    try:
        printed = []
        deadline = time.monotonic() + 60
        while not (printed and printed[-1].startswith("console: ")):  # once it answers
            try:
                printed.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"no 'console: URL' within 60 s: {printed}") from None
        yield printed[-1].split()[1]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.integration
def test_the_console_serves_with_its_extra(console_process: str) -> None:
    try:
        with urllib.request.urlopen(console_process, timeout=10) as response:
            status = response.status
    except urllib.error.HTTPError as refused:  # locked: asks who is there, which is an answer
        status = refused.code
    assert status < 500


@pytest.mark.integration
def test_the_readme_runs_in_an_install_with_the_agents_extra(
    venvs: dict[str, Venv], fleet_env: dict[str, str], tmp_path: Path
) -> None:
    # The README's path installs toolfleet[agents] (make demo does): its blocks run with that
    # virtualenv as their .venv, in a shell that has nothing of this checkout's.
    dev_bin = str(Path(sys.prefix) / "bin")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TOOLFLEET_") and key not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != dev_bin)
    env.update(fleet_env)
    run = run_readme(README, workdir=tmp_path, venv=venvs["agents"].path, env=env, timeout=240)
    assert not run.leftovers, f"the README left processes running: {run.leftovers}"
    assert any(block.runs and block.kind == "python" for block in run.blocks)


# -- the image -------------------------------------------------------------------------------


def test_the_image_installs_the_extras_docs_install_md_names() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    steps = (ROOT / "docker" / "steps.sh").read_text()
    docs = (ROOT / "docs" / "install.md").read_text()
    (image,) = re.findall(r"^ARG EXTRAS=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert f'extras="${{TOOLFLEET_EXTRAS-{image}}}"' in steps  # make image-check's default
    assert f"installs `toolfleet[{image}]`" in docs
    assert {"console", "mcp", "otlp"} <= set(image.split(","))  # the chart runs them all
