"""Runtime dtype guards for ReplaySSM decode entry points (``pip install replaylint[guards]``)."""
