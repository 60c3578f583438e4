"""Issue 10: a rules file with a huge or inexact number literal, or an encoding problem, is a RuleFileError naming
the file, line and literal (never an OverflowError traceback); a UTF-8 byte-order mark is simply accepted."""

import pytest
import torch
from helpers import run_cli
from neptune_eq.rules.files import RuleFileError, load_rules_file, parse_rules
from neptune_eq.rules.user import user_rules

import neptune_eq
from neptune_eq.cli import main


def _file(tmp_path, text: str, name: str = "r.rules", bom: bool = False):
    f = tmp_path / name
    f.write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    return f


def _tiny(x):
    return torch.softmax(x, dim=-1)


# ---------------------------------------------------------------- numbers and encodings in rules files


HUGE = [
    ("big", "99999999999999999999999", "does not fit a 64-bit integer"),
    ("googol4", "1" + "0" * 400, "does not fit a 64-bit integer"),
    ("hexbig", "0x1ffffffffffffffff", "does not fit a 64-bit integer"),
    ("inexact", "9007199254740993", "is not exactly a float64"),
    ("overflow", "1e400", "overflows float64"),
    ("underflow", "1e-400", "underflows float64"),
]


@pytest.mark.parametrize(("name", "literal", "match"), HUGE, ids=[h[0] for h in HUGE])
def test_bad_number_names_file_line_and_literal(tmp_path, name, literal, match):
    f = _file(tmp_path, f"ok: exp(a) -> exp(a)\n{name}: a * {literal} -> a\n")
    with pytest.raises(RuleFileError, match=match) as err:
        load_rules_file(f)
    msg = str(err.value)
    assert msg.startswith(f"{f}:2: ") and (literal[:20] in msg.splitlines()[0])


def test_huge_literal_through_compile(tmp_path):
    f = _file(tmp_path, "big: a * " + "1" + "0" * 400 + " -> a\n")
    with pytest.raises(RuleFileError, match=r"r\.rules:1: integer literal 1000.*does not fit a 64-bit integer"):
        neptune_eq.compile(_tiny, torch.randn(4, 16), rules=[str(f)], cache_dir=tmp_path)


def test_huge_literal_cli_has_no_traceback(tmp_path):
    f = _file(tmp_path, "big: a * 99999999999999999999999 -> a\n")
    r = run_cli("rules", "check", str(f))
    assert r.returncode == 1
    assert "r.rules:1: integer literal 99999999999999999999999 does not fit a 64-bit integer" in r.stdout
    assert "Traceback" not in r.stderr + r.stdout


def test_exact_numbers_are_accepted():
    (r,) = parse_rules("ok: a * 9007199254740992 -> a * 9007199254740992.0 if finite(a)", "x.rules")
    assert r.name == "ok"
    assert parse_rules("z: a * 0.0e5 -> a * 0", "x.rules")[0].name == "z"


def test_byte_order_mark_is_accepted(tmp_path, capsys):
    f = _file(tmp_path, "exp_sum: exp(a + b) -> exp(a) * exp(b)\n", bom=True)
    (r,) = load_rules_file(f)
    assert r.name == "exp_sum" and r.origin == f"{f}:1"
    assert [x.name for x in user_rules(str(f))] == ["exp_sum"]
    assert main(["rules", "check", str(f)]) == 0 and "ok    exp_sum" in capsys.readouterr().out
    assert parse_rules("\ufeffexp_sum: exp(a + b) -> exp(a) * exp(b)", "t.rules")[0].name == "exp_sum"


@pytest.mark.parametrize(("data", "match"), [
    (b"ok: exp(a) -> exp(a)\nbad: a \xe9 -> a\n", r"r\.rules:2: not a UTF-8 text file \(invalid continuation byte: "
                                                   r"byte 0xe9"),
    ("ok: exp(a) -> exp(a)\n".encode("utf-16"), "UTF-16 byte-order mark"),
    (b"ok: exp(a) -> exp(a)\n\xef\xbb\xbfnext: exp(a) -> exp(a)\n", r"r\.rules:2: character U\+FEFF \(ZERO WIDTH "
                                                                    r"NO-BREAK SPACE\) at column 1"),
    ("neg: a \u2212 b -> a\n".encode(), r"r\.rules:1: character U\+2212 \(MINUS SIGN\) at column 8"),
], ids=["invalid_utf8", "utf16", "bom_mid_file", "unicode_minus"])
def test_encoding_problems_are_clear(tmp_path, data, match):
    f = tmp_path / "r.rules"
    f.write_bytes(data)
    with pytest.raises(RuleFileError, match=match):
        load_rules_file(f)
