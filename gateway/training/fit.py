"""Fitting the difficulty head (damped Newton on soft labels) and writing it as the ONNX graph
that gateway.classifier.head.HeadSession serves (see that module for the graph's inputs and output).

`build_head_onnx` needs the `onnx` package (train extra).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.classifier.encoder import EMBEDDING_DIM
from gateway.classifier.head import FEATURES, Array

OPSET: Final = 17


def _vector(name: str, values: npt.ArrayLike) -> Array:
    out = np.asarray(values, dtype=np.float32).reshape(-1)
    if out.shape != (FEATURES,):
        raise ValueError(f"{name} must have {FEATURES} values (embedding + log_chars), got {out.shape[0]}")
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{name} has non-finite values")
    return out


def build_head_onnx(
    weights: npt.ArrayLike,
    bias: float,
    feature_mean: npt.ArrayLike,
    feature_std: npt.ArrayLike,
    metadata: dict[str, str] | None = None,
) -> bytes:
    """Serialized ONNX model of the head; mean/std (385,) standardize the concatenated features."""
    from onnx import TensorProto, checker, helper, numpy_helper

    w = _vector("weights", weights)
    mean, std = _vector("feature_mean", feature_mean), _vector("feature_std", feature_std)
    if np.any(std <= 0):
        raise ValueError("feature_std must be positive")
    inits = [
        numpy_helper.from_array(mean.reshape(1, FEATURES), "feature_mean"),
        numpy_helper.from_array(std.reshape(1, FEATURES), "feature_std"),
        numpy_helper.from_array(w.reshape(FEATURES, 1), "weights"),
        numpy_helper.from_array(np.array([[bias]], dtype=np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("Concat", ["embedding", "log_chars"], ["features"], axis=1),
        helper.make_node("Sub", ["features", "feature_mean"], ["centered"]),
        helper.make_node("Div", ["centered", "feature_std"], ["standardized"]),
        helper.make_node("MatMul", ["standardized", "weights"], ["dot"]),
        helper.make_node("Add", ["dot", "bias"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["difficulty"]),
    ]
    graph = helper.make_graph(
        nodes,
        "difficulty_head",
        [
            helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", EMBEDDING_DIM]),
            helper.make_tensor_value_info("log_chars", TensorProto.FLOAT, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("difficulty", TensorProto.FLOAT, ["batch", 1])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="gateway.train")
    model.ir_version = 8  # readable by any onnxruntime >= 1.10
    helper.set_model_props(model, dict(metadata or {}))
    checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


@dataclass(frozen=True, slots=True)
class HeadParams:
    """A fitted head: weights on standardized features, bias, and the standardization."""

    weights: npt.NDArray[np.float64]
    bias: float
    mean: npt.NDArray[np.float64]
    std: npt.NDArray[np.float64]

    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """numpy reference of the ONNX graph: scores (n,) of features (n, 385)."""
        z = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        return _sigmoid(z @ self.weights + self.bias)

    def to_onnx(self, metadata: dict[str, str] | None = None) -> bytes:
        return build_head_onnx(self.weights, self.bias, self.mean, self.std, metadata)


def _sigmoid(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = 0.5 * (1.0 + np.tanh(0.5 * x))  # stable for any x
    return out


def standardization(features: npt.ArrayLike, mode: str = "all") -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Mean and std of each feature ("all"), or of log_chars only ("length": embedding as is)."""
    x = np.asarray(features, dtype=np.float64)
    if mode not in ("all", "length"):
        raise ValueError(f"standardize must be 'all' or 'length', got {mode!r}")
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std < 1e-6] = 1.0
    if mode == "length":
        mean[:-1], std[:-1] = 0.0, 1.0
    return mean, std


def fit_head(
    features: npt.ArrayLike,
    labels: npt.ArrayLike,
    l2: float,
    *,
    standardize: str = "all",
    max_iter: int = 100,
    tol: float = 1e-7,
) -> tuple[HeadParams, int]:
    """L2-regularized logistic regression on soft labels in [0, 1] by damped Newton steps.

    Minimizes mean binary cross-entropy + l2/2 * |w|^2 (bias not penalized). Deterministic.
    Returns the head and the number of Newton iterations taken.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if x.ndim != 2 or x.shape[1] != FEATURES or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"need features (n, {FEATURES}) and n labels, got {x.shape} and {y.shape}")
    mean, std = standardization(x, standardize)
    z = np.hstack([(x - mean) / std, np.ones((x.shape[0], 1))])
    penalty = np.full(FEATURES + 1, l2)
    penalty[-1] = 0.0
    theta = np.zeros(FEATURES + 1)
    theta[-1] = float(np.log(np.clip(y.mean(), 1e-6, 1 - 1e-6) / np.clip(1 - y.mean(), 1e-6, 1)))
    with one_blas_thread():
        theta, iterations = newton_logistic(z, y, theta, penalty, max_iter, tol)
    return HeadParams(theta[:-1].copy(), float(theta[-1]), mean, std), iterations


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """One BLAS thread: a 386 x 386 solve gains nothing from more, and spinning threads on busy cores cost 100x."""
    try:
        threadpoolctl = importlib.import_module("threadpoolctl")  # optional (comes with scikit-learn)
    except ImportError:
        return contextlib.nullcontext()
    limits: contextlib.AbstractContextManager[object] = threadpoolctl.threadpool_limits(limits=1, user_api="blas")
    return limits


def newton_logistic(
    z: npt.NDArray[np.float64], y: npt.NDArray[np.float64], theta: npt.NDArray[np.float64],
    penalty: npt.NDArray[np.float64], max_iter: int = 100, tol: float = 1e-7,
) -> tuple[npt.NDArray[np.float64], int]:
    """Minimize mean BCE(sigmoid(z @ theta), y) + sum(penalty * theta^2) / 2 from `theta`; (theta, iterations)."""
    loss = _loss(z, y, theta, penalty)
    iterations = 0
    for iterations in range(1, max_iter + 1):
        p = _sigmoid(z @ theta)
        grad = z.T @ (p - y) / len(y) + penalty * theta
        if float(np.abs(grad).max()) < tol:
            break
        hess = (z * (p * (1 - p))[:, None]).T @ z / len(y) + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while (new := _loss(z, y, theta - scale * step, penalty)) > loss:
            scale *= 0.5  # backtracking keeps every step a descent
            if scale < 1e-6:
                return theta, iterations  # no descent left at float64 precision
        theta, loss = theta - scale * step, new
    return theta, iterations


def _loss(z: npt.NDArray[np.float64], y: npt.NDArray[np.float64], theta: npt.NDArray[np.float64], penalty: npt.NDArray[np.float64]) -> float:
    logit = z @ theta
    bce = np.logaddexp(0.0, logit) - y * logit  # = -y log p - (1 - y) log (1 - p)
    return float(bce.mean() + 0.5 * np.sum(penalty * theta * theta))
