"""The installed llama.cpp build is the portable one the Makefile chooses, at the version the lock pins.

Its default native build enables the build machine's every instruction set: AMX_INT8 on recent Xeons, whose path
crashes on the embedded model's first generation, and a wheel that dies with illegal instructions on older CPUs.
A change of flags (or a wheel from pip's cache built otherwise) fails here, not in a user's job.
"""

from __future__ import annotations

import importlib.util
import platform
from pathlib import Path

import pytest

from backends.llamacpp_backend import REBUILD_HINT, crash_line

REPO = Path(__file__).resolve().parents[2]
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not importable")


def features() -> dict[str, str]:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    pairs = (part.split("=") for part in info.replace("CPU :", "").split("|") if "=" in part)
    return {k.strip(): v.strip() for k, v in pairs}


@needs_llama
def test_the_build_uses_the_portable_instruction_sets_and_no_amx():
    found = features()
    assert not [k for k in found if k.startswith("AMX")], found
    machine = platform.machine()
    if machine == "x86_64":
        assert {k: found.get(k) for k in ("AVX", "AVX2", "FMA", "F16C")} == dict.fromkeys(("AVX", "AVX2", "FMA", "F16C"),
                                                                                         "1"), found
        assert not [k for k in found if k.startswith("AVX512") or k == "AVX_VNNI"], found  # not on every x86 server
    elif machine == "aarch64":
        assert found.get("NEON") == "1" and found.get("DOTPROD") == "1", found
        assert not [k for k in found if k.startswith(("AVX", "SSE", "F16C", "FMA", "BMI"))], found


@needs_llama
def test_the_installed_version_is_the_locked_one():
    import llama_cpp

    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert llama_cpp.__version__ == pins["llama-cpp-python"]


def test_a_crash_line_says_how_to_rebuild_an_amx_build():
    amx = "CPU : AVX2 = 1 | AMX_INT8 = 1 | OPENMP = 1 |"
    line = crash_line("/x/SmolLM2.gguf", "was killed by SIGSEGV", "complete", amx)
    assert line.endswith(REBUILD_HINT) and "make llama-cpp" in line and "SmolLM2.gguf" in line
    assert REBUILD_HINT not in crash_line("/x/SmolLM2.gguf", "was killed by SIGSEGV", "start", "CPU : AVX2 = 1 |")
