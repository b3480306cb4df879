"""Pure RL math: reward normalisation, advantages, policy loss, DP schedule, weight-sync bookkeeping."""
