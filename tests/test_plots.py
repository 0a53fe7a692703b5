"""Figures are built without pyplot, so nothing global (the inline backend, other figures) can touch them."""
import base64
import math
import struct

from conftest import DEFAULT_SPEC

from runbook.core import plots, spec
from runbook.kv import plan as kvplan
from runbook.kv import report as kvreport


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_figures_are_not_registered_with_pyplot():
    import matplotlib.pyplot as plt

    plt.close("all")
    p = kvplan.assess(spec.load(DEFAULT_SPEC), None)
    figs = [kvreport.plot_capacity(p), kvreport.plot_concurrency(p), kvreport.plot_memory(p)]
    assert plt.get_fignums() == []                 # pyplot never saw them: no backend hook can draw or close them
    for f in figs:
        w, h = _png_size(plots.png(f))
        assert 300 < w < 1000 and 200 < h < 700    # cropped to what is drawn, at 100 dpi


def test_same_inputs_same_png_bytes():
    p = kvplan.assess(spec.load(DEFAULT_SPEC), None, tp=4, kv_dtype="fp8_e4m3")
    assert plots.png(kvreport.plot_memory(p)) == plots.png(kvreport.plot_memory(p))


def test_show_displays_png_in_ipython_and_nothing_outside(capsys):
    from IPython import get_ipython
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    fig, ax = plots.figure((4, 3))
    ax.plot([1, 2, 3])
    assert get_ipython() is None
    plots.show(fig)
    assert capsys.readouterr().out == ""           # outside IPython, display() would print the Image's repr
    InteractiveShell.instance()
    try:
        with capture_output() as cap:
            plots.show(fig, None, fig)
        assert [o.data.keys() >= {"image/png"} for o in cap.outputs] == [True, True]
        assert _png_size(base64.b64decode(cap.outputs[0].data["image/png"]))[0] > 200
    finally:
        InteractiveShell.clear_instance()


def test_panel_redraws_only_when_a_rounded_input_changes(monkeypatch):
    from runbook.kv import plan as kvplan_mod

    calls = []
    real = kvplan_mod.assess
    monkeypatch.setattr(kvplan_mod, "assess", lambda *a, **k: calls.append(k) or real(*a, **k))
    box = kvreport.panel(spec.load(DEFAULT_SPEC))
    (tp, _dtype), (frac, _ctx) = box.children[0].children, box.children[1].children
    drawn = len(calls)                               # the base plan and the first drawing
    echo = math.nextafter(frac.value, 0)             # the browser's echo of the same position: 0.8799999…
    assert echo != frac.value and round(echo, 2) == frac.value
    frac.value = echo
    assert len(calls) == drawn
    tp.value = 4
    assert len(calls) == drawn + 1 and calls[-1]["tp"] == 4
    frac.value = 0.9
    assert len(calls) == drawn + 2 and calls[-1]["mem_fraction_static"] == 0.9
