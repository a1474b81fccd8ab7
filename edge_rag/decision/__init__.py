"""The answer/refuse decision: the evidence gate, the route policy, the certified score, its calibration and bounds."""
