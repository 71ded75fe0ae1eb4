"""The simulator: stands in for serving and for the users, so the production loop runs end to end here.

(the router's assignment of users to arms, the experiment's salted hash, is abpo.abtest.assignment: the A/B report
checks the logged users against the same function)
abpo.sim.retrieval   the retrieval stage: each request's candidates, fitted on the interactions to date
abpo.sim.preference  the users' ground truth: a mixture (sim.oracle, sim.oracle_weights) of the components
abpo.sim.oracles     knn, sequential and ALS preference models fitted on every interaction (future ones too);
                     no arm reads them (docs/simulator.md)
abpo.sim.clicks      the click model (documented in docs/loop.md; every parameter in config section `sim`)
abpo.sim.headroom    expected simulated CTR of a policy on a month's served requests, the oracle-greedy
                     ceiling and the random floor (benchmarks/headroom.py)
abpo.sim.simulator   month m's requests from real sequences, each arm's exposures, clicks, and the landed
                     Parquet month partition in the impressions contract (ingest cannot tell it from serving)
abpo.commands.simulate  `abpo simulate --month YYYY-MM`
"""
