"""``envmgr tune``'s choice of layout, fed made-up measurements: the fastest median wins
whether or not it is the default layout, and the printout recommends that one.

Real runs (``test_tune.py``) cannot pin this: which layout is fastest there depends on
the machine, and while the default is the fastest, a chooser that always picked the
default would pass them.
"""

from __future__ import annotations

import pytest

from envmgr.tune import Layout, Measurement, TuneResult
from envmgr.tune.result import fastest

ENV_ID, NUM_ENVS = "CartPole-v1", 4
CEILING = [1000.0, 1000.0, 1000.0]

DEFAULT = Layout(n_workers=2, default=True)
CALLER = Layout(n_workers=1, caller_envs=2)
FIRST_READY = Layout(n_workers=2, first_ready=True)


def _measured(layout: Layout, rates: list[float]) -> Measurement:
    return Measurement(
        layout,
        layout.label(NUM_ENVS),
        layout.call(ENV_ID, NUM_ENVS, {}),
        rates,
        [r / c for r, c in zip(rates, CEILING, strict=True)],
    )


def _result(measurements: list[Measurement]) -> TuneResult:
    best = fastest(measurements)
    return TuneResult(ENV_ID, NUM_ENVS, 2, 3, 0.1, CEILING, None, measurements, best, [], {})


@pytest.mark.parametrize(
    ("rates", "winner"),
    [
        # The default is fastest.
        ({DEFAULT: [800, 810, 790], CALLER: [700, 720, 710], FIRST_READY: [600, 610, 590]}, 0),
        # Another layout is: the caller's block, by its median.
        ({DEFAULT: [800, 810, 790], CALLER: [900, 880, 905], FIRST_READY: [600, 610, 590]}, 1),
        # By the median, not the best round or the mean: the default's one lucky round
        # (and its higher mean) do not outweigh first-ready's higher median.
        ({DEFAULT: [700, 2000, 690], CALLER: [500, 510, 505], FIRST_READY: [760, 750, 755]}, 2),
        # Measured last and fastest.
        ({DEFAULT: [800, 800, 800], CALLER: [801, 802, 803], FIRST_READY: [900, 950, 920]}, 2),
    ],
    ids=["default-fastest", "caller-fastest", "median-not-mean", "last-fastest"],
)
def test_the_fastest_median_is_chosen_and_recommended(
    rates: dict[Layout, list[float]], winner: int
) -> None:
    measurements = [_measured(layout, r) for layout, r in rates.items()]
    result = _result(measurements)
    chosen = measurements[winner]
    assert result.best is chosen
    assert result.call == chosen.call
    text = result.format()
    rows = [line for line in text.splitlines() if not line.startswith("* fastest.")]
    starred = [line for line in rows if line.startswith("* ")]
    assert len(starred) == 1 and chosen.label in starred[0], text
    use = text.split("Use:\n", 1)[1].splitlines()[0].strip()
    assert use == chosen.call
    why = text.split("Why:\n", 1)[1]
    if chosen.layout.default:
        assert "the default layout is the fastest here" in why, why
    else:
        ratio = chosen.rate / measurements[0].rate
        assert f"{chosen.label} ran" in why and f"{ratio:.2f}x the default layout" in why, why


def test_no_measurement_is_refused() -> None:
    with pytest.raises(ValueError, match="no layout was measured"):
        fastest([])
