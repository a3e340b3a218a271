"""Gradient defenses: mechanisms p(g | x) that perturb a client update.

Each defense lives in a module named for what it is (``noise``, ``dpsgd``,
``compression``, ``soteria``, ...) and implements :class:`base.GradientDefense`.
Import them from their modules, e.g. ``from leakagelib.defenses.noise import GaussianNoise``.
"""
