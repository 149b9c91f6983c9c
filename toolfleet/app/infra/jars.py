"""The Apache Kafka jars, resolved from Maven Central once per Kafka version into the cache."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

from kernel.errors import InfrastructureError
from kernel.settings import Settings
from toolfleet.app.infra.process import file_lock

log = logging.getLogger(__name__)

# Kafka logs through SLF4J 1.x and ships log4j-core without a binding; this is the log4j
# version Kafka 4.1 pulls. If another Kafka version pulls a different log4j-core, resolution
# is redone with the version actually found, so the binding always matches.
LOG4J_VERSION = "2.24.3"

_MARKER = "libs.complete"
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.toolfleet</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{kafka}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def kafka_libs(settings: Settings) -> Path:
    """The directory holding every jar the broker needs, resolving it first if necessary."""
    home = settings.cache_dir / f"kafka-{settings.kafka_version}"
    libs = home / "libs"
    if (home / _MARKER).exists():
        return libs
    with file_lock(home / "resolve.lock"):
        # Another process may have finished the download while we waited for the lock.
        if (home / _MARKER).exists():
            return libs
        log.info("resolving Kafka %s jars from Maven into %s", settings.kafka_version, libs)
        log4j = LOG4J_VERSION
        _resolve(home, settings.kafka_version, log4j)
        pulled = _log4j_core_version(libs)
        if pulled is not None and pulled != log4j:
            log.info("Kafka pulls log4j-core %s; resolving the matching SLF4J binding", pulled)
            _resolve(home, settings.kafka_version, pulled)
        if not (libs / f"kafka_2.13-{settings.kafka_version}.jar").exists():
            raise InfrastructureError(
                f"Maven finished but {libs} has no kafka_2.13-{settings.kafka_version}.jar; "
                f"check TOOLFLEET_KAFKA_VERSION and delete {home} to retry."
            )
        # Written last: a download interrupted half-way leaves no marker and is redone.
        (home / _MARKER).write_text(f"kafka_2.13 {settings.kafka_version}\n")
    return libs


def _resolve(home: Path, kafka: str, log4j: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise InfrastructureError(
            "Maven (mvn) is not on PATH; it downloads the Kafka jars. "
            "Install it (apt-get install -y maven) and run `toolfleet infra up` again."
        )
    libs = home / "libs"
    shutil.rmtree(libs, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    pom = home / "pom.xml"
    pom.write_text(_POM.format(kafka=kafka, log4j=log4j))
    argv = [
        mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={libs}",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=home, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise InfrastructureError(
            f"Maven could not resolve org.apache.kafka:kafka_2.13:{kafka} "
            f"(exit {done.returncode}). Check network access to Maven Central and the Kafka "
            f"version, then run `toolfleet infra up` again. Maven said:\n{output}"
        )


def _log4j_core_version(libs: Path) -> str | None:
    for jar in libs.glob("log4j-core-*.jar"):
        match = re.fullmatch(r"log4j-core-(.+)\.jar", jar.name)
        if match:
            return match.group(1)
    return None
