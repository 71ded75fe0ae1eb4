"""What a config file may be and what its refusal may print: ``--config`` of a special file (/dev/zero, a FIFO) or a
directory is refused before it is read (it read /dev/zero until the OOM killer stopped it at 22.4 GB, hung on a FIFO,
and gave an IsADirectoryError traceback), as is a file over the size bound; a YAML alias bomb is refused before it is
built (a 255-byte one printed a 39 MB refusal); and a refusal names the file and the rule with at most a short,
redacted excerpt of what it read (a foreign file's lines, /etc/shadow's password hashes, were echoed as unknown
keys)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from abpo.config import load_config
from abpo.config.errors import ConfigError


def one_line(rc: int, err: str) -> str:
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err[:2000]
    return err


def _bounded_python(code: str, *, memory_bytes: int = 1 << 30, timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose address space is capped at ``memory_bytes`` (resource.setrlimit): a read
    without a bound fails there with a MemoryError instead of taking the machine."""
    prelude = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, ({memory_bytes}, {memory_bytes}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


# ------------------------------------------------------------------------------------------ what a config file may be
def test_dev_zero_is_refused_before_it_is_read_under_a_memory_limit():
    proc = _bounded_python(
        """
        from abpo.config import load_config
        from abpo.config.errors import ConfigError
        try:
            load_config("/dev/zero")
        except ConfigError as e:
            print("REFUSED", e)
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED /dev/zero: a character device, not a regular file; rule: " in proc.stdout, proc.stdout[-2000:]


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    proc = _bounded_python(
        f"""
        from abpo.config import load_config
        from abpo.config.errors import ConfigError
        try:
            load_config({str(fifo)!r})
        except ConfigError as e:
            print("REFUSED", e)
        """,
        timeout=60,  # before: it waited for a writer forever
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"REFUSED {fifo}: a FIFO, not a regular file; rule: " in proc.stdout, proc.stdout[-2000:]


def test_a_directory_is_one_line_naming_the_rule(abpo, tmp_path):
    d = tmp_path / "configs.d"
    d.mkdir()
    err = one_line(*abpo("config", "--config", str(d))[::2])
    assert f"{d}: a directory, not a regular file; rule: a config is a regular YAML file" in err


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path):
    from abpo.yamlfile import MAX_CONFIG_BYTES

    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"big.yaml: .* bytes, over the bound of 1048576 bytes; rule: "):
        load_config(big)


# ---------------------------------------------------------------------------------------------------- alias bombs
BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
)


@pytest.mark.parametrize("where", ["top", "a known key"])
def test_an_alias_bomb_is_refused_before_it_is_built_in_one_short_line(abpo, tmp_path, where):
    path = tmp_path / "bomb.yaml"
    text = BOMB if where == "top" else "update:\n  warmup_ratio:\n" + textwrap.indent(BOMB, "    ")
    path.write_text(text)
    err = one_line(*abpo("config", "--config", str(path))[::2])
    assert len(err) < 600, len(err)
    assert f"{path}: " in err and "aliases expand to more than 10000 nodes" in err and "rule: " in err


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("update: &u\n  again: *u\n")
    with pytest.raises(ConfigError, match=r"loop.yaml: .*an alias inside its own anchor.*rule: "):
        load_config(path)


def test_a_few_aliases_and_merge_keys_are_read(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("extends: tiny\nexperiment:\n  seeds: &s [0, 1]\nupdate: &u\n  group_size: 4\n")
    cfg = load_config(path)
    assert cfg.update.group_size == 4 and cfg.experiment.seeds == [0, 1]


def test_a_set_value_that_is_a_bomb_is_refused_briefly():
    with pytest.raises(ConfigError) as info:
        load_config("tiny", ["policy.model=" + BOMB.replace("\n", ", ").join("{}")])
    assert len(str(info.value)) < 600 and "aliases expand" in str(info.value)


# --------------------------------------------------------------------------------- what a refusal prints of a file
SHADOW = "".join(f"user{i}:$6$saltsalt{i}$Zk3hashhashhashhashhashhashhash{i}:19000:0:99999:7:::\n" for i in range(40))


def test_a_foreign_file_is_refused_without_echoing_its_lines(abpo, tmp_path):
    path = tmp_path / "shadow"
    path.write_text(SHADOW)
    err = one_line(*abpo("config", "--config", str(path))[::2])
    assert f"{path}: 40 unknown key(s)" in err and "rule: " in err, err
    assert "$6$" not in err and "hashhash" not in err and "user1" not in err, err
    assert len(err) < 800, len(err)


def test_an_unknown_key_that_is_a_name_is_still_named(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("updat:\n  group_size: 4\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown key\(s\) \['updat'\]; known: "):
        load_config(path)


def test_a_long_value_is_shown_as_a_short_excerpt(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("update:\n  learning_rate: '" + "s3cr3t" * 5000 + "'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "update.learning_rate '" in msg and "rule: a finite number" in msg and len(msg) < 400, msg[:1000]


def test_a_duplicate_key_that_is_not_a_name_is_not_echoed(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("root:$6$hashhash:1::\nroot:$6$hashhash:1::\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "duplicate key" in msg and "line 2 (first at line 1)" in msg and "hashhash" not in msg, msg
