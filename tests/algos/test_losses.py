"""The clipped surrogate, the k3 KL and masked aggregation against hand-computed values."""

import math

import pytest
import torch

from algos.losses import k3_kl, masked_mean, policy_loss


def test_masked_mean_token_and_sequence():
    v = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(v, m).item() == pytest.approx(2.0)            # (1+2+3)/3
    assert masked_mean(v, m, "sequence-mean").item() == pytest.approx(2.25)  # (1.5+3)/2
    with pytest.raises(ValueError, match="'bogus'"):
        masked_mean(v, m, "bogus")


def test_masked_positions_get_no_gradient_even_when_infinite():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, -1e9]])  # a huge ratio on the masked position
    out = policy_loss(logp, old, torch.ones(1, 3), torch.tensor([[1, 1, 0]]))
    out.loss.backward()
    assert torch.isfinite(out.loss) and logp.grad[0, 2] == 0.0 and logp.grad[0, 0] != 0.0


def test_clipped_surrogate_by_hand():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))  # ratios vs old = 1
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    out = policy_loss(logp, old, adv, torch.ones(1, 3), clip_eps=0.2)
    # token 1: min(1.5, 1.2) * 1 = 1.2; token 2: min(-0.5, -0.8) = -0.8; token 3: min(2.2, 2.2) = 2.2
    assert out.loss.item() == pytest.approx(-(1.2 - 0.8 + 2.2) / 3, abs=1e-6)
    assert out.clip_fraction == pytest.approx(2 / 3)


def test_k3_kl_by_hand_and_its_mask():
    assert k3_kl(torch.tensor(0.0), torch.tensor(0.0)).item() == 0.0
    d = -0.5
    assert k3_kl(torch.tensor(0.0), torch.tensor(d)).item() == pytest.approx(math.exp(d) - d - 1)
    logp = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-1.5, -3.0]])
    out = policy_loss(logp, logp.detach(), torch.zeros(1, 2), torch.ones(1, 2), ref_logp_BT=ref,
                      kl_mask_BT=torch.tensor([[1, 0]]), kl_coef=0.1)
    assert out.kl == pytest.approx(math.exp(-0.5) + 0.5 - 1)  # only the first token carries KL
    assert out.loss.item() == pytest.approx(0.1 * out.kl)


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-mean"])
def test_chunks_with_the_batch_totals_add_up_to_the_batch(aggregation):
    """Rows 0-1 and row 2 as two chunks: with the whole batch's Totals their losses sum to the
    one-chunk loss, the KL part included (its tokens are not the loss tokens)."""
    from algos.losses import Totals

    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0], [-1.2, -0.1, -0.9]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.8, -0.5], [-0.2, -0.9, 0.0], [-1.0, -0.4, -0.6]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    ref = torch.tensor([[-1.5, -1.0, -0.2], [-0.1, -0.2, 0.0], [-1.0, -1.0, -1.0]])
    kl_mask = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 1, 1]])
    kw = dict(kl_coef=0.5, aggregation=aggregation)
    whole = policy_loss(logp, old, adv, mask, ref_logp_BT=ref, kl_mask_BT=kl_mask, **kw)
    totals = Totals.of_rows([3, 2, 3], [True, False, True])
    assert totals == Totals(tokens=8, rows=3, kl_tokens=6, kl_rows=2)
    parts = [policy_loss(logp[s], old[s], adv[s], mask[s], ref_logp_BT=ref[s], kl_mask_BT=kl_mask[s],
                         totals=totals, **kw) for s in (slice(0, 2), slice(2, 3))]
    assert sum(p.loss for p in parts).item() == pytest.approx(whole.loss.item(), rel=1e-6)
    assert sum(p.kl for p in parts) == pytest.approx(whole.kl, rel=1e-6)
    # without the totals each chunk is its own mean: the sum is another objective
    alone = [policy_loss(logp[s], old[s], adv[s], mask[s], ref_logp_BT=ref[s], kl_mask_BT=kl_mask[s], **kw)
             for s in (slice(0, 2), slice(2, 3))]
    assert sum(p.loss for p in alone).item() != pytest.approx(whole.loss.item(), rel=1e-3)
