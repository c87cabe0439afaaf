"""Windows on the driver (numpy): pane partials, windows combined from them and their state
between micro-batches, the noisy release of differentially private windows, and a pure-Python
reference for the tests. No Spark import here."""
