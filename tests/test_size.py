"""parse_size / format_size: the size forms users write in limits.

parse_size must accept and refuse exactly what the C library's
hami_parse_size (native/src/size.c) does; test_agrees_with_c runs both.
"""

import subprocess
from pathlib import Path

import pytest

from hami_jupyter.slice.size import format_size, parse_size

REPO = Path(__file__).resolve().parent.parent
GiB = 1024**3
MiB = 1024**2

ACCEPTED = [
    ("1073741824", GiB),
    ("1", 1),
    ("100B", 100),
    ("1.0", 1),  # a fraction of a byte is refused, a zero fraction is not
    ("4g", 4 * GiB),
    ("4G", 4 * GiB),
    ("4096m", 4 * GiB),
    ("4096M", 4 * GiB),
    ("4Gi", 4 * GiB),
    ("4GiB", 4 * GiB),
    ("4GB", 4 * GiB),  # binary too: the HAMi meaning
    ("4gib", 4 * GiB),
    ("4gb", 4 * GiB),
    ("1.5g", 3 * GiB // 2),
    (".5g", GiB // 2),
    ("1536MiB", 3 * GiB // 2),
    ("1048576k", GiB),
    ("1048576KiB", GiB),
    ("2t", 2 * 1024**4),
    ("0.5k", 512),
    ("0.1k", 102),  # fractions round down to whole bytes
    ("0.9999999999k", 1023),  # only nine fraction digits count
    ("007g", 7 * GiB),
    ("0", 0),  # a size; refusing a zero *limit* is the limit reader's job
    ("0g", 0),
    ("0.0001k", 0),  # rounds down to zero bytes
    ("18446744073709551615", 2**64 - 1),
    ("16777215T", 16777215 * 1024**4),
]

REFUSED = [
    "",
    "1.5",  # a fraction of a byte
    "-1",
    "-4g",
    "+4g",
    "g",
    "B",
    ".",
    ".g",
    "1.g",
    "4x",
    "4gx",
    "4ib",
    "4gbi",
    "4 g",
    " 4g",
    "4g ",
    "4g\n",
    "1e9",
    "0x10",
    "4p",
    "1,5g",
    "18446744073709551616",  # 2**64
    "16777216t",  # 2**64
    "99999999999999999999999999t",
]


@pytest.mark.parametrize("text, expected", ACCEPTED)
def test_parse_size_accepts(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", REFUSED)
def test_parse_size_refuses(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message
    assert "4g" in message and "1536MiB" in message  # names the accepted forms


def test_parse_size_wants_text():
    with pytest.raises(TypeError):
        parse_size(4096)


def test_agrees_with_c(tmp_path):
    """The same inputs through native/src/size.c give the same answers."""
    driver = tmp_path / "size_probe.c"
    driver.write_text(
        "#include <stdio.h>\n#include <stdint.h>\n#include \"hami.h\"\n"
        "int main(int argc, char **argv) {\n"
        "  for (int i = 1; i < argc; i++) {\n"
        "    uint64_t v;\n"
        "    if (hami_parse_size(argv[i], &v) == 0) printf(\"%llu\\n\", (unsigned long long)v);\n"
        "    else printf(\"error\\n\");\n"
        "  }\n  return 0;\n}\n"
    )
    exe = tmp_path / "size_probe"
    native = REPO / "native"
    cmd = ["cc", "-std=gnu11", f"-I{native / 'include'}", f"-I{native / 'src'}",
           "-o", str(exe), str(driver), str(native / "src" / "size.c")]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, f"{' '.join(cmd)} failed:\n{built.stderr}"

    inputs = [text for text, _ in ACCEPTED] + [t for t in REFUSED if "\n" not in t]
    answers = subprocess.run([str(exe), *inputs], capture_output=True, text=True, check=True).stdout.split("\n")
    assert len(answers) == len(inputs) + 1, f"the probe answered {answers!r}"
    disagreements = []
    for text, c_answer in zip(inputs, answers):
        try:
            py_answer = str(parse_size(text))
        except ValueError:
            py_answer = "error"
        if py_answer != c_answer:
            disagreements.append(f"{text!r}: C {c_answer}, Python {py_answer}")
    assert not disagreements, "size.c and size.py disagree:\n" + "\n".join(disagreements)


@pytest.mark.parametrize(
    "n, expected",
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536 * MiB, "1.5 GiB"),
        (4 * GiB, "4.0 GiB"),
        (GiB - 1, "1.0 GiB"),  # not "1024.0 MiB"
        (2**64 - 1, "16.0 EiB"),
    ],
)
def test_format_size(n, expected):
    assert format_size(n) == expected


def test_format_size_refuses_negative():
    with pytest.raises(ValueError):
        format_size(-1)
