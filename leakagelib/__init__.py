"""leakagelib: gradient leakage in federated learning.

The library behind the book *Gradient Leakage, Executed*. It holds the data
loaders, the model zoo of the three papers, client updates, metrics, attacks,
defenses and rank analysis; the chapters in ``book/`` call it and never
re-implement it.
"""

__version__ = "0.1.0"
