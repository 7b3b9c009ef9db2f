"""The MultiAgent-OPD learner: advantages, losses, Teacher scoring, the Stage I / Stage II
trainer, the Prompted Critic, SFT warm start and checkpoints."""
