"""YAML as abpo's config files are read (configs/*.yaml, ``--config``, ``--set`` values, configs/regimes.yaml).

A leaf module (it imports nothing of abpo): abpo.config and abpo.experiment.regimes both read through it.

- Booleans are ``true`` / ``false`` only (YAML 1.2): ``yes``, ``on``, ``no`` stay strings (a bool field refuses them).
- ``1e-5`` is a float (YAML 1.2; PyYAML's YAML 1.1 reads a string); ``.nan`` and ``.inf`` are floats (a field
  refuses them as not finite).
- A key given twice in one mapping is refused (:class:`DuplicateKey`), naming the key and both lines, instead of the
  last one silently winning.
- A file is read only when it is a regular file of at most :data:`MAX_CONFIG_BYTES` (:func:`read_config_text`): a
  device (/dev/zero), a FIFO or a directory is refused before it is read.
- Aliases may not expand the document by more than :data:`MAX_ALIAS_EXPANSION` nodes, nor contain themselves
  (:class:`AliasExpansion`): checked on the composed nodes, before anything is built.
- A refusal shows what it read only as :func:`excerpt` does: short, and a key only when it is a name (:func:`shown_key`).
- A config file may start from another: ``extends: demo`` (a preset, ``configs/demo.yaml``) or ``extends: base.yaml``
  (a file, relative to this one). :func:`config_chain` reads the file and its parents; abpo.config merges them (the
  child's keys win) before it checks anything, and the DAG file reads ``arms.approval`` through the same chain.
"""

from __future__ import annotations

import os
import re
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "EXTENDS",
    "MAX_ALIAS_EXPANSION",
    "MAX_CONFIG_BYTES",
    "AliasExpansion",
    "ConfigLoader",
    "DuplicateKey",
    "YAMLFileError",
    "config_chain",
    "excerpt",
    "read_config_text",
    "read_yaml",
    "shown_key",
    "yaml_value",
]

# A config file is a few kilobytes (the largest preset is under 3 KB, configs/regimes.yaml about 10 KB): a file
# larger than this is not a config, and reading it whole would spend memory on nothing (/dev/zero has no end).
MAX_CONFIG_BYTES = 1 << 20
# The nodes aliases may add to a document beyond those written in it. A config's aliases (a shared list, a merge key)
# add tens; 7 levels of 9 aliases (a 255-byte file) add 4.8 million, which every later walk of the value (a refusal
# printing it, a config dump, a hash) pays for.
MAX_ALIAS_EXPANSION = 10_000
RULE = "a config is a regular YAML file of at most 1 MiB (1048576 bytes), a mapping of sections"
EXCERPT_CHARS = 80  # the most a refusal shows of one value it read

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_excerpt_repr = reprlib.Repr()
_excerpt_repr.maxlevel, _excerpt_repr.maxlist, _excerpt_repr.maxtuple = 3, 8, 8
_excerpt_repr.maxdict, _excerpt_repr.maxset = 6, 6
_excerpt_repr.maxstring, _excerpt_repr.maxother, _excerpt_repr.maxlong = EXCERPT_CHARS, EXCERPT_CHARS, EXCERPT_CHARS


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` as a refusal may show it: nested containers and long strings cut by reprlib (which never walks
    more than it shows, so a huge or shared structure costs nothing), then at most ``limit`` characters, with the
    length of what was left out. A short value is its plain repr."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[: limit // 2]!r}... ({len(value)} characters)"
    text = _excerpt_repr.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def shown_key(key: Any) -> str:
    """A key read from a file as a refusal may name it: its repr when it is a name (``'updat'``: letters, digits,
    ``_ . -``, at most 64 characters), else only what it is (a line of a foreign file, such as /etc/shadow's
    ``user:$6$hash:...``, is never echoed)."""
    if isinstance(key, str) and _NAME.fullmatch(key):
        return repr(key)
    return f"<a {type(key).__name__} key of {len(str(key))} characters, not a name>"


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first})")
        self.key, self.line, self.first = key, line, first


class AliasExpansion(yaml.YAMLError):
    """Aliases that would expand the document past :data:`MAX_ALIAS_EXPANSION` nodes, or an alias inside its own
    anchor (a structure that contains itself): refused on the composed nodes, before anything is built."""

    def __init__(self, problem: str, line: int):
        super().__init__(problem)
        self.problem, self.line = problem, line


class YAMLFileError(ValueError):
    """A config file that is not YAML or holds a key twice: the message names the file, the line and the rule."""


def check_alias_expansion(node: yaml.Node, limit: int = MAX_ALIAS_EXPANSION) -> None:
    """AliasExpansion when the node graph ``node`` (an alias is a node shared by several parents) expands to more than
    ``limit`` nodes beyond those it holds, or holds a cycle. Each node is sized once (its expanded size, from its
    children's), without recursion (a chain of aliases is as deep as it is long), so the check costs the written
    document, not its expansion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        n, children_done = stack.pop()
        k = id(n)
        kids = _children(n)
        if children_done:
            open_nodes.discard(k)
            sizes[k] = 1 + sum(sizes[id(c)] for c in kids)
            continue
        if k in sizes:
            continue
        if k in open_nodes:
            raise AliasExpansion(
                "an alias inside its own anchor (a structure that contains itself)", n.start_mark.line + 1
            )
        open_nodes.add(k)
        stack.append((n, True))
        for c in kids:
            if id(c) in open_nodes:
                raise AliasExpansion(
                    "an alias inside its own anchor (a structure that contains itself)", c.start_mark.line + 1
                )
            if id(c) not in sizes:
                stack.append((c, False))
    if sizes[id(node)] - len(sizes) > limit:
        raise AliasExpansion(f"aliases expand to more than {limit} nodes beyond the {len(sizes)} written", 1)


def _children(n: yaml.Node) -> list[yaml.Node]:
    if isinstance(n, yaml.SequenceNode):
        return list(n.value)
    if isinstance(n, yaml.MappingNode):
        return [x for pair in n.value for x in pair]
    return []


class ConfigLoader(yaml.SafeLoader):
    """YAML as a config reads it: booleans are true/false only (YAML 1.2; `yes`, `on`, `no` stay strings and are
    refused by a bool field), 1e-5 is a float (YAML 1.2; PyYAML's YAML 1.1 reads a string), and a key given twice in
    one mapping is refused (:class:`DuplicateKey`) instead of the last one silently winning."""

    def construct_document(self, node):
        check_alias_expansion(node)  # before anything is built from it
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                k = self.construct_object(key_node, deep=True)
                try:
                    if k in seen:
                        raise DuplicateKey(k, key_node.start_mark.line + 1, seen[k])
                    seen[k] = key_node.start_mark.line + 1
                except TypeError:
                    continue  # an unhashable key: SafeLoader's own error
        return super().construct_mapping(node, deep=deep)


_BOOL, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
ConfigLoader.yaml_implicit_resolvers = {
    c: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _FLOAT)]
    for c, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
ConfigLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def yaml_value(raw: str) -> Any:
    """One value (a ``--set`` right-hand side) read by :class:`ConfigLoader`; yaml.YAMLError when it is not YAML."""
    return yaml.load(raw, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)


def read_config_text(path: str | Path) -> str:
    """The text of the config file ``path``, read only when it is a regular file of at most :data:`MAX_CONFIG_BYTES`
    bytes; YAMLFileError naming the file and the rule otherwise (a directory, a device such as /dev/zero, a FIFO, a
    socket; a file too large; not UTF-8). The file is opened without blocking (a FIFO with no writer does not wait)
    and checked on the open descriptor, so what is checked is what is read."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise YAMLFileError(f"{path}: cannot be read ({e.strerror or type(e).__name__}); rule: {RULE}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise YAMLFileError(f"{path}: {_file_kind(st.st_mode)}, not a regular file; rule: {RULE}")
        if st.st_size > MAX_CONFIG_BYTES:
            raise YAMLFileError(f"{path}: {st.st_size} bytes, over the bound of {MAX_CONFIG_BYTES} bytes; rule: {RULE}")
        chunks, got = [], 0
        while got <= MAX_CONFIG_BYTES:  # the size on disk may change while it is read: the bound holds anyway
            chunk = os.read(fd, min(1 << 16, MAX_CONFIG_BYTES + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > MAX_CONFIG_BYTES:
            raise YAMLFileError(f"{path}: over the bound of {MAX_CONFIG_BYTES} bytes; rule: {RULE}")
    except OSError as e:
        raise YAMLFileError(f"{path}: cannot be read ({e.strerror or type(e).__name__}); rule: {RULE}") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise YAMLFileError(f"{path}: not UTF-8 text (byte {e.start}); rule: {RULE}") from None


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def read_yaml(path: str | Path) -> Any:
    """The YAML file ``path`` (read by :func:`read_config_text`: a regular file, bounded) read by
    :class:`ConfigLoader`; YAMLFileError naming the file, the line and the rule for a duplicate key, aliases that
    expand too far, or anything that is not YAML. The refusal never quotes more of the file than a key that is a
    name (:func:`shown_key`)."""
    text = read_config_text(path)
    try:
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKey as e:
        raise YAMLFileError(
            f"{path}: duplicate key {shown_key(e.key)} at line {e.line} (first at line {e.first}); "
            "rule: each key once per mapping"
        ) from None
    except AliasExpansion as e:
        raise YAMLFileError(
            f"{path}: {e.problem} (line {e.line}); rule: aliases may add at most {MAX_ALIAS_EXPANSION} nodes to a "
            "config and may not contain themselves"
        ) from None
    except RecursionError:
        raise YAMLFileError(f"{path}: nested too deeply to read; rule: {RULE}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = str(getattr(e, "problem", None) or e).splitlines()[0][:EXCERPT_CHARS]
        raise YAMLFileError(f"{path}: not valid YAML{where}: {problem}") from None


EXTENDS = "extends"  # the top-level key naming a config file's parent
EXTENDS_RULE = "extends names a preset (demo: configs/demo.yaml) or a YAML file relative to this one (base.yaml)"


def parent_file(path: Path, name: Any, presets: Path) -> Path:
    """The file that ``extends: name`` in the config file ``path`` names: a bare name is the preset
    ``presets/<name>.yaml``; a name ending in .yaml / .yml or holding a folder is a file relative to ``path``'s folder
    (an absolute one as it is). YAMLFileError naming the file and the rule for anything but a non-empty string."""
    if not isinstance(name, str) or not name.strip():
        raise YAMLFileError(f"{path}: extends {name!r}: rule: {EXTENDS_RULE}")
    p = Path(name.strip())
    if p.suffix in (".yaml", ".yml") or len(p.parts) > 1:
        return path.parent / p
    return presets / f"{p}.yaml"


def config_chain(path: str | Path, presets: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The config file ``path`` and every file it extends (``extends:``, :func:`parent_file`), the farthest parent
    first, each as (file, its mapping without the ``extends`` key), each read by :func:`read_yaml`. YAMLFileError
    naming the file and the rule for a file that is not a mapping, a parent that does not exist, or a cycle (a file
    that extends itself, directly or through its parents)."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    current = Path(path)
    while True:
        raw = read_yaml(current)
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise YAMLFileError(f"{current}: top level must be a mapping")
        raw = dict(raw)
        name = raw.pop(EXTENDS, None)
        chain.append((current, raw))
        if name is None:
            return chain[::-1]
        parent = parent_file(current, name, presets)
        if not parent.is_file():
            known = sorted(p.stem for p in presets.glob("*.yaml"))
            raise YAMLFileError(
                f"{current}: extends {name!r}: no such file {parent}; rule: {EXTENDS_RULE}; presets: {known}"
            )
        seen = [p.resolve() for p, _ in chain]
        if parent.resolve() in seen:
            loop = " -> ".join(str(p) for p in [*(p for p, _ in chain[seen.index(parent.resolve()) :]), parent])
            raise YAMLFileError(
                f"{current}: extends {name!r} makes a cycle ({loop}); rule: a config may not extend itself, "
                "directly or through the files it extends"
            )
        current = parent
