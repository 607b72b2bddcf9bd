"""Find JGit and what it needs in a local Maven repository, without a network.

Interop tests run JGit (one of the clients that must work unmodified, DESIGN.md
"Git protocol") from jars already under ``~/.m2/repository``. The lookup reads
the JGit jar's own pom (and the parent pom that pins dependency versions) so
the classpath is the one JGit was released against when those jars are
present, and the newest local version of each dependency otherwise. It never
downloads anything: a missing jar is reported, and the caller skips.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "JGIT_ARTIFACT",
    "JGitLookup",
    "default_m2_repository",
    "find_jgit_classpath",
    "java_feature_version",
    "locate_jgit",
]

JGIT_GROUP = "org.eclipse.jgit"
JGIT_ARTIFACT = "org.eclipse.jgit"
# slf4j prints a warning per JVM without a provider; a no-op one keeps stderr for JGit.
_SLF4J_NOP = ("org.slf4j", "slf4j-nop")
_POM_NS = re.compile(r"^\{[^}]*\}")
_PROPERTY = re.compile(r"\$\{([^}]+)\}")
_SKIPPED_SCOPES = frozenset(("test", "provided", "system", "import"))
_JAVA_ENV = re.compile(rb"JavaSE-(?:1\.)?(\d+)")
_JAVA_SPEC = re.compile(rb"java\.specification\.version = (?:1\.)?(\d+)")


@dataclass(frozen=True, slots=True)
class JGitLookup:
    """The chosen JGit version and its classpath, or why there is none."""

    version: str | None
    classpath: tuple[Path, ...] | None
    problems: tuple[str, ...]  # one line per version tried and what it lacked


def default_m2_repository() -> Path:
    return Path.home() / ".m2" / "repository"


def _version_key(version: str) -> tuple[tuple[int, ...], str]:
    """Maven-ish ordering good enough for JGit's `7.4.0.202509020913-r` style."""
    numbers = tuple(int(part) for part in re.findall(r"\d+", version))
    return numbers, version


def _artifact_dir(m2: Path, group: str, artifact: str) -> Path:
    return m2.joinpath(*group.split("."), artifact)


def _jar(m2: Path, group: str, artifact: str, version: str) -> Path:
    return _artifact_dir(m2, group, artifact) / version / f"{artifact}-{version}.jar"


def _local_versions(m2: Path, group: str, artifact: str) -> list[str]:
    """Versions with a jar on disk, newest first."""
    base = _artifact_dir(m2, group, artifact)
    if not base.is_dir():
        return []
    found = [d.name for d in base.iterdir() if _jar(m2, group, artifact, d.name).is_file()]
    return sorted(found, key=_version_key, reverse=True)


def _tag(element: ET.Element) -> str:
    return _POM_NS.sub("", element.tag)


def _child(element: ET.Element, name: str) -> ET.Element | None:
    for sub in element:
        if _tag(sub) == name:
            return sub
    return None


def _text(element: ET.Element, name: str) -> str | None:
    sub = _child(element, name)
    return sub.text.strip() if sub is not None and sub.text else None


@dataclass(frozen=True, slots=True)
class _Pom:
    properties: dict[str, str]
    managed: dict[tuple[str, str], str]  # dependencyManagement (group, artifact) -> version
    dependencies: tuple[tuple[str, str, str | None], ...]  # runtime deps: group, artifact, version
    parent: tuple[str, str, str] | None


def _read_pom(path: Path) -> _Pom | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    properties: dict[str, str] = {}
    props = _child(root, "properties")
    if props is not None:
        for prop in props:
            properties[_tag(prop)] = (prop.text or "").strip()
    managed: dict[tuple[str, str], str] = {}
    management = _child(root, "dependencyManagement")
    listed = _child(management, "dependencies") if management is not None else None
    for dep in listed if listed is not None else ():
        group, artifact = _text(dep, "groupId"), _text(dep, "artifactId")
        version = _text(dep, "version")
        if group and artifact and version:
            managed[(group, artifact)] = version
    dependencies: list[tuple[str, str, str | None]] = []
    deps = _child(root, "dependencies")
    for dep in deps if deps is not None else ():
        group, artifact = _text(dep, "groupId"), _text(dep, "artifactId")
        if not group or not artifact:
            continue
        scope = _text(dep, "scope") or "compile"
        if scope in _SKIPPED_SCOPES or _text(dep, "optional") == "true":
            continue
        dependencies.append((group, artifact, _text(dep, "version")))
    parent_el = _child(root, "parent")
    parent = None
    if parent_el is not None:
        pg, pa, pv = (_text(parent_el, n) for n in ("groupId", "artifactId", "version"))
        if pg and pa and pv:
            parent = (pg, pa, pv)
    return _Pom(properties, managed, tuple(dependencies), parent)


def _expand(value: str, properties: dict[str, str]) -> str:
    return _PROPERTY.sub(lambda m: properties.get(m.group(1), m.group(0)), value)


def _required_java(jar: Path) -> int | None:
    """The Java feature release a bundle declares (OSGi Bundle-RequiredExecutionEnvironment)."""
    try:
        with zipfile.ZipFile(jar) as archive:
            manifest = archive.read("META-INF/MANIFEST.MF")
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    unfolded = manifest.replace(b"\r\n ", b"").replace(b"\n ", b"")
    for line in unfolded.splitlines():
        if line.startswith((b"Bundle-RequiredExecutionEnvironment:", b"Java-Version:")):
            match = _JAVA_ENV.search(line) or re.search(rb"(\d+)", line)
            if match:
                return int(match.group(1))
    return None


def _resolve(m2: Path, version: str) -> tuple[tuple[Path, ...] | None, str]:
    """Classpath for one JGit version, or a line naming what it lacks."""
    jgit_dir = _artifact_dir(m2, JGIT_GROUP, JGIT_ARTIFACT) / version
    pom = _read_pom(jgit_dir / f"{JGIT_ARTIFACT}-{version}.pom")
    if pom is None:
        return None, f"{JGIT_ARTIFACT} {version}: no readable pom in {jgit_dir}"
    properties = {"project.version": version, **pom.properties}
    managed = dict(pom.managed)
    ancestor = pom.parent
    for _ in range(4):  # jgit -> org.eclipse.jgit-parent; deeper chains are not expected
        if ancestor is None:
            break
        group, artifact, parent_version = ancestor
        parent_dir = _artifact_dir(m2, group, artifact) / parent_version
        parent = _read_pom(parent_dir / f"{artifact}-{parent_version}.pom")
        if parent is None:
            break  # unpinned deps fall back to the newest local jar
        properties = {**parent.properties, **properties}
        managed = {**parent.managed, **managed}
        ancestor = parent.parent
    classpath = [_jar(m2, JGIT_GROUP, JGIT_ARTIFACT, version)]
    missing: list[str] = []
    for group, artifact, declared in pom.dependencies:
        wanted = declared or managed.get((group, artifact))
        wanted = _expand(wanted, properties) if wanted else None
        local = _local_versions(m2, group, artifact)
        if wanted and wanted in local:
            classpath.append(_jar(m2, group, artifact, wanted))
        elif local:
            classpath.append(_jar(m2, group, artifact, local[0]))
        else:
            missing.append(f"{group}:{artifact}:{wanted or '?'}")
    if missing:
        return None, f"{JGIT_ARTIFACT} {version}: missing {', '.join(missing)} under {m2}"
    api = next((p for p in classpath if p.name.startswith("slf4j-api-")), None)
    if api is not None:
        major = api.parent.name.split(".")[0]
        nop = [v for v in _local_versions(m2, *_SLF4J_NOP) if v.split(".")[0] == major]
        if nop:
            classpath.append(_jar(m2, *_SLF4J_NOP, nop[0]))
    return tuple(classpath), ""


def locate_jgit(m2_repository: Path | None = None, *, java_feature: int = 17) -> JGitLookup:
    """The newest local JGit that runs on Java `java_feature`, with its dependencies."""
    m2 = m2_repository if m2_repository is not None else default_m2_repository()
    versions = _local_versions(m2, JGIT_GROUP, JGIT_ARTIFACT)
    if not versions:
        where = _artifact_dir(m2, JGIT_GROUP, JGIT_ARTIFACT)
        return JGitLookup(None, None, (f"no {JGIT_GROUP}:{JGIT_ARTIFACT} jar under {where}",))
    problems: list[str] = []
    for version in versions:
        needs = _required_java(_jar(m2, JGIT_GROUP, JGIT_ARTIFACT, version))
        if needs is not None and needs > java_feature:
            problems.append(f"{JGIT_ARTIFACT} {version}: needs Java {needs} > {java_feature}")
            continue
        classpath, problem = _resolve(m2, version)
        if classpath is not None:
            return JGitLookup(version, classpath, tuple(problems))
        problems.append(problem)
    return JGitLookup(None, None, tuple(problems))


def find_jgit_classpath(
    m2_repository: Path | None = None, *, java_feature: int = 17
) -> list[Path] | None:
    """Jars to put on `javac`/`java -cp` for JGit, or None when no usable set is local."""
    found = locate_jgit(m2_repository, java_feature=java_feature)
    return list(found.classpath) if found.classpath is not None else None


def java_feature_version(java: Path | str = "java") -> int | None:
    """The feature release (17, 21, ...) of a `java` launcher, or None if it does not run."""
    try:
        done = subprocess.run(
            [str(java), "-XshowSettings:properties", "-version"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _JAVA_SPEC.search(done.stderr + done.stdout)
    return int(match.group(1)) if match and done.returncode == 0 else None
