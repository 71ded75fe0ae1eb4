"""`abpo experiment`: the paper's Table 1, its ablation, the validation sweep and successive update rounds, on
any dataset the loaders read. Sits above abpo.evaluation (metrics), abpo.train (updates) and abpo.policy."""
