"""Issue 43, item 4, reduced until it is small enough to see: one Searcher turn of one token
whose Teacher prefers an action the student rarely takes. The student is a softmax over
logits ``z``; its rows go through the learner's own OPD advantage
(:func:`algos.advantages.opd_advantages`) and loss (:func:`algos.losses.policy_loss`), and
one plain gradient step is compared with the analytic expectation.

With ``A(a) = beta (log pi_T(a) - log pi(a))`` and ratio 1 at the start, the expected
gradient of the token-mean surrogate is ``-pi_j (A_j - E_pi[A])``, so one SGD step of size
``lr`` moves the logits by ``lr * pi * (A - E_pi[A])``. ``E_pi[A] = -beta KL(pi || pi_T)``:
OPD's advantage is the sampled gradient of the reverse KL to the Teacher."""

from __future__ import annotations

import numpy as np
import torch

from algos.advantages import opd_advantages
from algos.losses import policy_loss

V, TARGET, BETA, LR = 8, 5, 1.0, 3.0


def _distributions():
    student = torch.full((V,), 0.0)
    student[TARGET] = -1.5  # the student takes the Teacher's action 1 time in 30
    teacher = torch.full((V,), -2.0)
    teacher[TARGET] = 2.0  # the Teacher takes it 7 times in 10
    return student, teacher.log_softmax(-1)


def _learner_step(z: torch.Tensor, teacher_logp: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """The logits after one SGD step on ``n`` sampled one-token rows through the learner's
    own advantage and loss (no clipping can bind: the ratio is 1 at the old weights)."""
    z = z.clone().requires_grad_(True)
    logp = z.log_softmax(-1)
    actions = torch.multinomial(logp.exp().detach(), n, replacement=True, generator=torch.Generator().manual_seed(seed))
    old = logp.detach()[actions].numpy()
    adv = opd_advantages(teacher_logp[actions].numpy(), old, np.ones(n), beta=BETA)
    out = policy_loss(logp[actions][:, None], torch.tensor(old)[:, None], torch.tensor(adv, dtype=torch.float32)[:, None],
                      torch.ones(n, 1), aggregation="token-mean")
    out.loss.backward()
    return (z - LR * z.grad).detach()


def _analytic_step(z: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    pi = z.softmax(-1)
    adv = BETA * (teacher_logp - pi.log())
    return z + LR * pi * (adv - (pi * adv).sum())


def test_one_step_of_opd_alone_moves_the_rare_action_as_the_analytic_gradient_says():
    z, teacher_logp = _distributions()
    before = z.softmax(-1)[TARGET].item()
    analytic = _analytic_step(z, teacher_logp).softmax(-1)[TARGET].item()
    learned = _learner_step(z, teacher_logp, n=400_000, seed=0).softmax(-1)[TARGET].item()
    assert before < 0.05 and analytic - before > 0.02  # a rare action, a visible expected move
    assert abs(learned - analytic) < 0.1 * (analytic - before), (before, analytic, learned)


def test_steps_of_opd_alone_carry_the_student_to_the_teacher_and_the_kl_falls():
    """On-policy: each step samples from the current student. The Teacher's action's
    probability rises toward the Teacher's and the reverse KL falls at every step, as the
    expected-gradient dynamics do."""
    z, teacher_logp = _distributions()
    expected = z.clone()
    kls, probs = [], []
    for step in range(12):
        z = _learner_step(z, teacher_logp, n=50_000, seed=step + 1)
        expected = _analytic_step(expected, teacher_logp)
        logp = z.log_softmax(-1)
        kls.append(float((logp.exp() * (logp - teacher_logp)).sum()))
        probs.append(float(logp[TARGET].exp()))
        assert abs(probs[-1] - float(expected.softmax(-1)[TARGET])) < 0.03, (step, probs[-1])
    assert all(b < a for a, b in zip(kls, kls[1:])), kls
    assert probs[-1] > 0.5 and kls[-1] < 0.1 * kls[0], (probs, kls)


def test_a_teacher_equal_to_the_student_moves_nothing():
    z, _ = _distributions()
    moved = _learner_step(z, z.log_softmax(-1), n=10_000, seed=0)
    assert torch.equal(moved, z)
