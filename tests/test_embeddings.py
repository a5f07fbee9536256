import numpy as np
import pytest

from mclib.analyses.embeddings import (
    alignment,
    captured_variance,
    component_tracks,
    embedding_progress,
    fit_pca,
    norm_symmetry,
    position_norms,
    position_rows,
    position_silhouette,
    position_tsne,
    project,
    token_ids,
    token_norms,
    token_projections,
    token_rows,
    token_values,
)
from mclib.core.checkpoints import load_checkpoint, saved_steps
from mclib.core.config import ModelConfig
from mclib.core.model import build_model

N = 7


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(layers=1, heads=2, hidden=16, intermediate=32), N, seed=0)


def test_token_helpers_pick_ids_851_to_1151(model):
    ids = token_ids()
    assert ids.tolist() == list(range(851, 1152))
    assert token_values()[[0, 150, -1]].tolist() == [-1.5, 0.0, 1.5]
    rows = token_rows(model)
    table = model.bert.embeddings.word_embeddings.weight.detach()
    assert (
        rows.shape == (301, 16)
        and np.allclose(rows[0], table[851].numpy())
        and np.allclose(rows[-1], table[1151].numpy())
    )
    df = token_norms(model)
    assert list(df.columns) == ["value", "id", "norm"] and df["id"].iloc[150] == 1001


def _value_rows(rng, noise=0.01):
    """Rows built from |x| along one direction and sign(x) along another: E12's picture."""
    x = token_values()
    a, b = rng.normal(size=(2, 32))
    return x, np.abs(x)[:, None] * a + np.sign(x)[:, None] * b + noise * rng.normal(size=(len(x), 32))


def test_pca_projection_alignment_and_tracks():
    rng = np.random.default_rng(0)
    x, rows = _value_rows(rng)
    pca = fit_pca(rows)
    assert np.allclose(project(rows, pca), rows @ pca.components_.T)  # the authors: no centring
    assert np.allclose(project(rows + 5.0, pca, centred=True), project(rows, pca, centred=True))
    final = project(rows, pca, centred=True)
    assert abs(alignment(project(rng.normal(size=rows.shape), pca, True), final)) < 0.3
    tracks = component_tracks(final, x).set_index("component")
    assert max(tracks["abs_x"]) > 0.9 and max(tracks["sign_x"]) > 0.9
    assert norm_symmetry(x, np.linalg.norm(rows, axis=1)) > 0.99  # |x| and sign²: symmetric


def test_alignment_by_hand():
    final = np.array([[1.0, 0.0], [0.0, 1.0]])
    earlier = np.array([[1.0, 1.0], [1.0, 0.0]])
    # column 1: cos([1, 1], [1, 0]) = 1/√2; column 2: cos([1, 0], [0, 1]) = 0; the mean of the two
    assert alignment(earlier, final) == pytest.approx(1 / (2 * np.sqrt(2)))
    assert alignment(3 * earlier, final) == pytest.approx(1 / (2 * np.sqrt(2)))  # scale-free
    assert alignment(-final, final) == pytest.approx(-1)


def test_captured_variance_by_hand():
    # 8 points ±2, ±1, ±0.5 along three axes: variances 4, 1, 0.25; the PCA plane holds the first two
    corners = np.array([[a, b, c] for a in (-2, 2) for b in (-1, 1) for c in (-0.5, 0.5)], dtype=float)
    pca = fit_pca(corners)
    assert captured_variance(corners, pca) == pytest.approx(5 / 5.25)
    # other rows in that plane: ±0.1 in the plane, ±3 across it
    flat = corners * [0.05, 0.1, 6]
    assert captured_variance(flat, pca) == pytest.approx((0.01 + 0.01) / (0.01 + 0.01 + 9))


def _column_clustered(rng, noise=0.05):
    centres = rng.normal(size=(N, 32))
    return centres[np.arange(N * N) % N] + noise * rng.normal(size=(N * N, 32))


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_silhouette_high_for_columns_and_zero_for_random(metric):
    rng = np.random.default_rng(0)
    clustered = _column_clustered(rng)
    assert position_silhouette(clustered, N, "column", metric) > 0.8
    assert position_silhouette(clustered, N, "row", metric) < 0
    noise = rng.normal(size=(N * N, 32))
    assert abs(position_silhouette(noise, N, "column", metric)) < 0.1
    assert abs(position_silhouette(noise, N, "row", metric)) < 0.1


@pytest.mark.slow
def test_tsne_is_seeded_and_keeps_columns_apart():
    rows = _column_clustered(np.random.default_rng(1))
    a, b = position_tsne(rows, N, seed=0), position_tsne(rows, N, seed=0)
    assert list(a.columns) == ["position", "row", "column", "x", "y"] and len(a) == N * N
    assert np.allclose(a[["x", "y"]], b[["x", "y"]])
    assert position_silhouette(a[["x", "y"]].to_numpy(), N, "column", "euclidean") > 0.5


def test_position_rows_and_norms(model):
    rows = position_rows(model)
    assert rows.shape == (N * N, 16)
    df = position_norms(rows, N)
    assert df["column"].tolist()[:8] == [0, 1, 2, 3, 4, 5, 6, 0] and df["row"].iloc[-1] == N - 1


def test_bad_inputs_name_the_value(model):
    rows = position_rows(model)
    with pytest.raises(ValueError, match="n = 6"):
        position_silhouette(rows, 6)
    with pytest.raises(ValueError, match="n = 8"):
        position_rows(model, 8)
    with pytest.raises(ValueError, match="'diagonal'"):
        position_silhouette(rows, N, by="diagonal")
    with pytest.raises(ValueError, match="hidden size 8"):
        project(np.zeros((301, 8)), fit_pca(token_rows(model)))


def _by_hand(run, step, final_step, centred):
    """E13's numbers at `step` from numpy alone: the final rows' top-2 principal axes by
    SVD, the step's rows projected on them, cosine per axis with the final projection."""
    rows = lambda s: (
        load_checkpoint(run, s).bert.embeddings.word_embeddings.weight.detach()[851:1152].double().numpy()
    )
    final, mine = rows(final_step), rows(step)
    axes = np.linalg.svd(final - final.mean(0), full_matrices=False)[2][:2].T  # [hidden, 2]
    shift = lambda r: r - r.mean(0) if centred else r
    p, q = shift(mine) @ axes, shift(final) @ axes
    cos = (p * q).sum(0) / (np.linalg.norm(p, axis=0) * np.linalg.norm(q, axis=0))
    c = mine - mine.mean(0)
    return cos.mean(), ((c @ axes) ** 2).sum() / (c**2).sum()


def test_progress_has_one_row_per_saved_step(smoke_run):
    df = embedding_progress(smoke_run)
    steps = saved_steps(smoke_run)
    assert df["step"].tolist() == steps
    first = df.iloc[0]
    aligned, captured = _by_hand(smoke_run, steps[0], steps[-1], centred=True)
    assert first["token_alignment"] == pytest.approx(aligned, abs=1e-6) and first[
        "token_captured"
    ] == pytest.approx(captured)
    assert first["token_alignment"] < 0.999  # not the last step compared with itself
    assert df[["column_silhouette", "row_silhouette"]].abs().le(1).all().all()
    with pytest.raises(ValueError, match="final_step 7"):
        embedding_progress(smoke_run, final_step=7)


def test_token_projections_at_chosen_steps(smoke_run):
    steps = saved_steps(smoke_run)
    coords, summary = token_projections(smoke_run, steps[:2] + steps[-1:])
    assert summary["step"].tolist() == steps[:2] + steps[-1:] and len(coords) == 3 * 2 * 301
    first = summary.iloc[0]
    for centred in (False, True):
        aligned, captured = _by_hand(smoke_run, steps[0], steps[-1], centred)
        assert first[f"alignment_{'centred' if centred else 'uncentred'}"] == pytest.approx(aligned, abs=1e-6)
    assert first["captured"] == pytest.approx(captured)
    assert summary["captured"].between(0, 1).all()
    final = coords[(coords.step == steps[-1]) & coords.centred]
    assert final[["pc1", "pc2"]].mean().abs().max() < 1e-9  # centred coordinates have mean 0
    with pytest.raises(ValueError, match=r"\[7\]"):
        token_projections(smoke_run, [7])
    init = build_model(
        ModelConfig(layers=2, heads=2, hidden=16, intermediate=32), N, seed=1
    )  # the smoke init
    coords, summary = token_projections(smoke_run, steps[-1:], initial=init)
    assert summary["step"].tolist() == [0, steps[-1]] and summary["alignment_centred"].iloc[0] < 1


def test_value_range_keeps_the_values_the_task_produces(smoke_run):
    from mclib.analyses import embeddings as E

    assert E.value_range(1) == (-1.0, 1.0) and E.value_range(2) == (-1.5, 1.5)
    assert len(E.token_values(*E.value_range(1))) == 201
    progress = E.embedding_progress(smoke_run, lo=-1.0, hi=1.0)
    coords, _ = E.token_projections(smoke_run, saved_steps(smoke_run)[:1], lo=-1.0, hi=1.0)
    assert coords["value"].abs().max() == 1.0 and len(progress)


def test_the_tables_are_read_from_the_weights_file_as_the_model_holds_them(smoke_run):
    """checkpoint_embeddings (two tensors of model.safetensors, no model built) gives the rows
    token_rows and position_rows read from the loaded model, at every saved step; a step not
    saved is named."""
    from mclib.analyses.embeddings import position_rows, token_rows
    from mclib.core.checkpoints import checkpoint_embeddings

    for step in saved_steps(smoke_run):
        tables, model = checkpoint_embeddings(smoke_run, step), load_checkpoint(smoke_run, step, device="cpu")
        assert tables["n"] == model.config.matrix_n
        assert np.array_equal(token_rows(tables), token_rows(model))
        assert np.array_equal(position_rows(tables), position_rows(model))
    with pytest.raises(FileNotFoundError, match="no checkpoint at step 7"):
        checkpoint_embeddings(smoke_run, 7)
