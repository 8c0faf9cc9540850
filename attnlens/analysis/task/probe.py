"""The probe: a logistic regression on standardised pooled features (:class:`Probe`, fitted by
:func:`fit_probe`, its penalty chosen by :func:`choose_c`), and the same as a trainable head (:class:`ProbeHead`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

CONSTANT_SPREAD = 1e-6  # a feature spread below this fraction of the median spread is rounding, not signal
PROBE_CS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # the grid :func:`choose_c` searches


@dataclass(frozen=True)
class Probe:
    """A fitted logistic regression on standardised features: ``logits = ((x - mean) / scale) @ coef.T + intercept``.

    Binary probes carry one row of ``coef``; their logits are ``[0, z]``.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    iterations: int
    converged: bool

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        """(classes, features) weights and (classes,) biases on standardised features, the
        binary case's zero row for class 0 included."""
        if self.coef.shape[0] > 1:
            return self.coef, self.intercept
        return np.concatenate([np.zeros_like(self.coef), self.coef]), np.concatenate([[0.0], self.intercept])

    def logits(self, features: np.ndarray) -> np.ndarray:
        weights, bias = self.weights()
        return ((features - self.mean) / self.scale) @ weights.T + bias

    def torch_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The same logits, differentiable in ``features`` (for training a change against the task)."""
        as_tensor = lambda array: torch.as_tensor(array, dtype=torch.float64, device=features.device)
        weights, bias = self.weights()
        return ((features.double() - as_tensor(self.mean)) / as_tensor(self.scale)) @ as_tensor(weights).T + as_tensor(bias)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.logits(features).argmax(1)


def standardiser(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation per feature (as scikit-learn's ``StandardScaler``), with
    features whose spread is below :data:`CONSTANT_SPREAD` of the median spread treated as
    constant (scale 1). Pooled hidden states have such dimensions: their spread is float
    rounding (1e-32), and dividing by it would turn the smallest change to attention, or
    dropout while fine-tuning, into an enormous feature.

    >>> mean, scale = standardiser(np.array([[0.0, 1.0], [2.0, 1.0 + 1e-20]]))
    >>> scale.tolist()
    [1.0, 1.0]
    """
    mean, scale = features.mean(0), features.std(0)
    return mean, np.where(scale < CONSTANT_SPREAD * np.median(scale), 1.0, scale)


def choose_c(features: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """The probe's ``C`` from :data:`PROBE_CS` by 5-fold stratified cross-validation on the
    training features (accuracy; ties go to the stronger penalty), standardised once by
    :func:`standardiser`. Held-out examples are never used.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(100, 3)); y = (x[:, 0] > 0).astype(int)
    >>> choose_c(x, y) in PROBE_CS
    True
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    mean, scale = standardiser(features)
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    scores = [
        cross_val_score(LogisticRegression(C=c, max_iter=5000), (features - mean) / scale, labels, cv=folds).mean()
        for c in PROBE_CS
    ]
    return float(PROBE_CS[int(np.argmax(scores))])


def fit_probe(features: np.ndarray, labels: np.ndarray, c: float = 1.0, max_iter: int = 5000) -> Probe:
    """:func:`standardiser`, then scikit-learn's ``LogisticRegression(C=c)`` (lbfgs), as a :class:`Probe`.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(200, 3)); y = (x[:, 0] > 0).astype(int)
    >>> probe = fit_probe(x, y)
    >>> probe.converged, float((probe.predict(x) == y).mean()) > 0.95
    (True, True)
    """
    from sklearn.linear_model import LogisticRegression

    mean, scale = standardiser(features)
    regression = LogisticRegression(C=c, max_iter=max_iter).fit((features - mean) / scale, labels)
    iterations = int(np.max(regression.n_iter_))
    return Probe(mean, scale, regression.coef_, regression.intercept_, iterations, iterations < max_iter)


class ProbeHead(nn.Module):
    """The probe as a trainable head: ``logits = linear((x - mean) / scale)``, starting at the
    probe's weights. The standardisation stays fixed: on raw features the small per-feature
    scales would make the head's weights large and fine-tuning unstable."""

    # buffers (registered in __init__): declared so that they read as tensors, not nn.Module's Tensor | Module
    mean: torch.Tensor
    scale: torch.Tensor

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        coef, intercept = probe.weights()
        self.register_buffer("mean", torch.as_tensor(probe.mean, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(probe.scale, dtype=torch.float32))
        self.linear = nn.Linear(coef.shape[1], coef.shape[0])
        with torch.no_grad():
            self.linear.weight.copy_(torch.as_tensor(coef))
            self.linear.bias.copy_(torch.as_tensor(intercept))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear((features - self.mean) / self.scale)
