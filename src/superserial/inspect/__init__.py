"""Looking at a whole dataset: ``superserial.stats`` (one streaming pass, bounded memory) and
``superserial.show`` (a grid of its images)."""
