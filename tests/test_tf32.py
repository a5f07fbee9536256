"""TF32 emulated on the CPU (mclib.core.tf32): the rounding, the products it rounds in both
passes, and a step of the default profile under `train.precision: tf32`."""

import torch
import torch.nn.functional as F

from mclib.core.config import load_profile, profile_path
from mclib.core.tf32 import EmulateTF32, round_tf32


def by_hand(v: float) -> float:
    """TF32 rounding of one float, written out on the mantissa: to nearest of the 2^10 steps
    between powers of two, ties away from zero."""
    import math

    if v == 0 or not math.isfinite(v):
        return v
    m, e = math.frexp(abs(v))  # v = m 2^e, 0.5 <= m < 1: 11 significant bits kept
    kept = math.floor(m * 2**11 + 0.5) / 2**11
    return math.copysign(kept * 2**e, v)


def test_rounding_keeps_ten_mantissa_bits_to_nearest_ties_away():
    one = 1.0
    cases = [
        one,
        one + 2**-11,
        one + 2**-10 + 2**-11,
        -(one + 2**-11),
        one + 2**-12,
        3.14159,
        -2.5e-3,
        1 - 2**-24,
        6.5e4,
        1e-30,
    ]
    got = round_tf32(torch.tensor(cases)).tolist()
    assert got == [torch.tensor(by_hand(c)).item() for c in cases]
    assert got[1] == one + 2**-10 and got[2] == one + 2**-9 and got[3] == -(one + 2**-10)  # ties: away from 0
    assert got[4] == one and got[5] == 3.140625 and got[7] == one  # below half: down
    special = round_tf32(torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0]))
    assert special[:2].tolist() == [float("inf"), -float("inf")] and special[2].isnan() and special[3] == 0


def test_random_values_round_as_by_hand_and_land_on_the_tf32_grid():
    x = torch.randn(2000, generator=torch.Generator().manual_seed(0)) * 10 ** torch.empty(2000).uniform_(
        -6, 6
    )
    r = round_tf32(x)
    assert r.tolist() == [torch.tensor(by_hand(v)).item() for v in x.tolist()]
    assert (r.view(torch.int32) & 0x1FFF).eq(0).all()  # the 13 dropped bits are zero
    assert ((r - x).abs() <= x.abs() * 2**-11).all()  # within half a TF32 place
    assert not torch.equal(r, x)


def test_a_linear_layer_multiplies_rounded_inputs_in_both_passes():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 16, generator=g, requires_grad=True)
    w = torch.randn(8, 16, generator=g, requires_grad=True)
    b = torch.randn(8, generator=g, requires_grad=True)
    up = torch.randn(3, 5, 8, generator=g)
    with EmulateTF32() as mode:
        y = F.linear(x, w, b)
        (y * up).sum().backward()
    assert mode.counts == {"linear": 1}
    xr, wr, ur = round_tf32(x.detach()), round_tf32(w.detach()), round_tf32(up)
    torch.testing.assert_close(y, xr @ wr.T + b, rtol=0, atol=1e-5)  # one product, fp32 sums in another order
    torch.testing.assert_close(x.grad, ur @ wr, rtol=0, atol=1e-5)
    torch.testing.assert_close(w.grad, ur.reshape(-1, 8).T @ xr.reshape(-1, 16), rtol=0, atol=1e-4)
    torch.testing.assert_close(b.grad, up.sum((0, 1)), rtol=0, atol=1e-5)
    exact = x.detach() @ w.detach().T + b.detach()
    assert (y - exact).abs().max() > 1e-4  # the rounding is there: fp32 is not TF32


def test_a_batched_matmul_is_rounded_and_sdpa_is_left_alone():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g, requires_grad=True) for _ in range(3))
    with EmulateTF32() as mode:
        s = torch.matmul(q, k.transpose(-1, -2))
        s.sum().backward()
        out = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach())
    assert mode.counts == {"matmul": 1}
    torch.testing.assert_close(
        s, round_tf32(q.detach()) @ round_tf32(k.detach()).transpose(-1, -2), rtol=0, atol=1e-5
    )
    torch.testing.assert_close(q.grad, torch.ones(2, 4, 9, 9) @ round_tf32(k.detach()), rtol=0, atol=1e-5)
    assert torch.equal(out, F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach()))


def test_every_linear_layer_of_the_model_goes_through_the_mode_and_attention_does_not():
    from mclib.core.data import sample_batch
    from mclib.core.model import build_model, predict

    p = load_profile(profile_path("cpu"))
    for attention, matmuls in (("sdpa", 0), ("eager", 2 * p.model.layers)):  # eager: QKᵀ and PV a layer
        m = build_model(p.model, p.data.n, 1)
        m.config._attn_implementation = attention  # read at every forward
        b = sample_batch(8, p.data.n, p.data.rank, p.data.p_mask, torch.Generator().manual_seed(0))
        with EmulateTF32() as mode:
            predict(m, b).sum().backward()
        linears = sum(isinstance(x, torch.nn.Linear) for x in m.modules())
        assert mode.counts == ({"linear": linears} | ({"matmul": matmuls} if matmuls else {})), attention


def test_a_tf32_step_on_the_cpu_is_emulated_eager_and_differs_from_fp32(logged):
    from mclib.core.step import TrainingRun
    from mclib.core.variants import step_function

    p = load_profile(profile_path("cpu")).replace(**{"train.compile": True})
    fp32 = step_function(p.replace(**{"train.compile": False}), torch.device("cpu"))
    tf32 = step_function(p.replace(**{"train.precision": "tf32"}), torch.device("cpu"))
    assert "TF32 products emulated" in logged.err()
    a, b = fp32(), tf32()
    assert not torch.equal(a, b) and torch.allclose(a, b, rtol=1e-2)  # the same losses, to TF32's precision
    run = TrainingRun.in_memory(p.replace(**{"train.precision": "tf32"}), torch.device("cpu"))
    assert run.compiled is run.model  # compiled code would bypass the mode
