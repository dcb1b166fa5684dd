"""Verdicts of the recipes parking, spectra, frozen and atlas: each stated criterion applied
to measured numbers on both sides of it (the claims are built from hand-made measurements,
so these tests take milliseconds)."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.analysis.closedforms import expected_strong_centers
from attnflow.experiments import atlas, frozen, parking, spectra
from attnflow.experiments._recipe import NOT_REPRODUCED, NOT_RUN, PARTLY, REPRODUCED


# ------------------------------------------------------------------------------ parking
def _s2_row(delta: float, n: int, mean: float, se: float) -> dict:
    """A strong-center row on S^2 as the recipe records it, with a given Monte Carlo mean."""
    exact = float(expected_strong_centers(n, delta, 3))
    return {"d": 3, "n": n, "delta": delta, "mc_mean": mean, "mc_se": se, "exact_E_n": exact,
            "E_inf": float(expected_strong_centers(np.inf, delta, 3)),
            "z": (mean - exact) / se, "printed_paper_E_inf": 1 / (3 * np.sin(delta / 2) ** 2)}


def test_parking_printed_formula_verdict_follows_the_measured_ratio():
    delta, n = 1.0, 200  # E_n within 1 % of E_inf here
    printed = 1 / (3 * np.sin(delta / 2) ** 2)
    corrected = 1 / np.sin(delta / 2) ** 2
    assert expected_strong_centers(n, delta, 3) >= parking._NEAR_LIMIT * corrected
    # counts as the printed formula predicts: reproduced
    agree = parking._printed_claim([_s2_row(delta, n, 0.995 * printed, 0.01)])
    assert agree.verdict == REPRODUCED and "within the allowed" in agree.why
    # counts at the corrected value, about 3 x printed: not reproduced, with the numbers
    typo = parking._printed_claim([_s2_row(delta, n, corrected, 0.01)])
    assert typo.verdict == NOT_REPRODUCED
    assert f"{corrected / printed:.2f}" in typo.measured and "missed by" in typo.why
    # just outside the criterion's interval: z_1 = 2.58 standard errors above printed
    z = parking._z_crit(1)
    edge = [_s2_row(delta, n, printed + f * z * 0.01, 0.01) for f in (0.9, 1.1)]
    assert [parking._printed_claim([r]).verdict for r in edge] == [REPRODUCED, NOT_REPRODUCED]


def test_parking_strong_center_verdict_counts_standard_errors():
    z = parking._z_crit(1)
    rows = [_s2_row(0.5, 200, expected_strong_centers(200, 0.5, 3) + f * z * 0.1, 0.1)
            for f in (0.9, 1.5, 2.5)]
    got = [parking._strong_claim([r], 3, 100).verdict for r in rows]
    assert got == [REPRODUCED, PARTLY, NOT_REPRODUCED]  # within z, within 2 z, beyond


# ------------------------------------------------------------------------------ spectra
def _summary(real: int, complex_: int, negative: int) -> dict:
    return {"n_heads": real + complex_, "n_positive": real - min(negative, real),
            "n_negative": min(negative, real), "n_complex": complex_,
            "n_lambda_max_re_negative": negative, "negative_heads": []}


@pytest.mark.parametrize(("real", "complex_", "want"), [(7, 5, REPRODUCED), (6, 6, NOT_REPRODUCED),
                                                        (2, 10, NOT_REPRODUCED)])
def test_spectra_most_heads_real(real, complex_, want):
    claim = spectra._real_claim("m", _summary(real, complex_, 0))
    assert claim.verdict == want and f"{real} of {real + complex_}" in claim.measured


@pytest.mark.parametrize(("trained", "baseline", "want"), [
    (3, 0, REPRODUCED), (3, 2, PARTLY), (0, 0, PARTLY), (0, 1, NOT_REPRODUCED)])
def test_spectra_repulsive_heads_learned(trained, baseline, want):
    claim = spectra._repulsive_claim("m", _summary(8, 4, trained), _summary(12, 0, baseline))
    assert claim.verdict == want


# ------------------------------------------------------------------------------- frozen
def test_frozen_thresholds_are_computed_not_typed():
    """eps = 0.1, c = 6.5: Remark B.2 is (c - 1 - 2 eps)^2 / 2 = 14.045 and
    (eps / (c - 1)) e^{3 (c - 1 - 2 eps)^2 / 8} = 682.9: the printed 14 and 700 are within 5 %;
    (i)-(ii) hold at (14, 700) and allow 3762.8 = 5.5 x 682.9 there."""
    claim = frozen._numbers_claim(6.5, 0.1)
    assert claim.verdict == REPRODUCED
    gap = 6.5 - 1 - 0.2
    assert f"{gap ** 2 / 2:.4f}" in claim.measured
    assert f"{0.1 / 5.5 * np.exp(3 * gap ** 2 / 8):.2f}" in claim.measured
    # other printed numbers, on both sides of each criterion
    assert frozen._numbers_claim(6.5, 0.1, printed=(14.045, 682.0)).verdict == REPRODUCED
    assert frozen._numbers_claim(6.5, 0.1, printed=(14.0, 1000.0)).verdict == PARTLY  # 46 % off
    assert frozen._numbers_claim(6.5, 0.1, printed=(14.0, 4000.0)).verdict == NOT_REPRODUCED
    # another c: the printed numbers are not its Remark's
    assert frozen._numbers_claim(8.0, 0.1).verdict != REPRODUCED


def _frozen_rows(form: str, worst: float, f: float = 1.0, exact: bool = True) -> list[dict]:
    return [{"form": form, "beta": 14.045, "bound": 682.9, "f": f, "N": 600.0, "n": 100,
             "m": 3, "weight": 167.0, "radius": 0.03, "exact_holds": exact,
             "remark_holds": f <= 1, "final_fraction_min": worst,
             "final_fraction_mean": (1 + worst) / 2, "final_max_dist_over_radius": 0.5,
             "time_all_within": [10.0 if worst == 1.0 else np.inf]}]


@pytest.mark.parametrize(("worst", "want"), [(1.0, REPRODUCED), (0.95, PARTLY),
                                             (0.5, NOT_REPRODUCED)])
def test_frozen_capture_verdict(worst, want):
    params = {"eps": 0.1, "c": 6.5, "t_end": 100.0, "runs": 2}
    assert frozen._within_claim("remark", _frozen_rows("remark", worst), params).verdict == want
    past = frozen._past_claim(_frozen_rows("remark", worst, f=2.0), params)
    assert past.verdict == want
    # all captured but no setting past the Remark's bound where (i)-(ii) hold: only partly
    if worst == 1.0:
        rows = _frozen_rows("remark", 1.0, f=2.0, exact=False)
        assert frozen._past_claim(rows, params).verdict == PARTLY
    assert frozen._past_claim(_frozen_rows("remark", worst), params).verdict == NOT_RUN


# -------------------------------------------------------------------------------- atlas
def _atlas_record(qk: str, as_predicted: int, metastable: int, other: int) -> dict:
    n = as_predicted + metastable + other
    return {"row": "point-in-L", "qk": qk, "predicted": "point-in-L",
            "observed": ["point-in-L"] * as_predicted + ["k-clusters"] * (metastable + other),
            "metastable": [False] * as_predicted + [True] * metastable + [False] * other,
            "n_clusters": [1] * as_predicted + [2] * (metastable + other),
            "max_dist_L": [0.0] * n, "final_speed": [0.0] * n}


@pytest.mark.parametrize(("counts", "want"), [
    ((18, 2, 0), REPRODUCED), ((17, 3, 0), PARTLY), ((10, 0, 10), PARTLY),
    ((9, 11, 0), NOT_REPRODUCED), ((2, 18, 0), NOT_REPRODUCED)])
def test_atlas_row_verdict_counts_only_runs_as_predicted(counts, want):
    """2 of 20 as predicted and 18 meta-stable is not reproduced (meta-stable runs are not the
    configuration the row names), whatever their sum."""
    params = {"qk": ["identity"], "t_end": 500.0}
    claim = atlas._row_claim("point-in-L", [_atlas_record("identity", *counts)], params)
    assert claim.verdict == want
    assert f"{counts[0]}/20 runs as predicted" in claim.measured
    assert f"as_predicted = {counts[0] / 20:.4g}" in claim.why
    assert claim.criterion in claim.why and claim.id == "atlas.point_in_L"


@pytest.mark.parametrize(("random_as_predicted", "want"), [(16, REPRODUCED), (10, PARTLY)])
def test_atlas_qk_verdict_compares_the_fractions(random_as_predicted, want):
    params = {"qk": ["identity", "random"], "bases": ["orthonormal"], "seeds": 20}
    records = []
    for row in atlas.SPECTRA:
        random = random_as_predicted if row == "point-in-L" else 20
        for qk, k in (("identity", 20), ("random", random)):
            rec = _atlas_record(qk, k, 0, 20 - k)
            records.append({**rec, "row": row, "predicted": row,
                            "observed": [row] * k + ["other"] * (20 - k)})
    claim = atlas._qk_claim(records, params)
    assert claim.verdict == want  # a gap of 20 % is allowed, 50 % is not
    one_kind = atlas._qk_claim(records, {**params, "qk": ["identity"]})
    assert one_kind.verdict == NOT_RUN
