"""``attnlens report --quick --model DIR`` on every captured decoder of tests/zoo.py (tests/test_zoo_report.py
says how, and runs the encoders)."""

from __future__ import annotations

import pytest

from zoo import DECODERS, check_report


@pytest.mark.parametrize("architecture", DECODERS)
def test_the_report_runs_on_every_captured_decoder(architecture, tmp_path, minilm_l6, monkeypatch, capsys):
    check_report(architecture, tmp_path, minilm_l6, monkeypatch, capsys)
