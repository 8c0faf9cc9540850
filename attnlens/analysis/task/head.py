"""The ``head`` protocol: the model's own sequence-classification head, its columns matched to the task's classes."""

from __future__ import annotations

from attnlens.errors import BadInput
from attnlens.models.loading import LoadedModel


def head_columns(model: LoadedModel, label_names: tuple[str, ...]) -> list[int]:
    """For each of the task's classes, in order, the column of the model's classification head
    that predicts it, matched by name (case and spaces aside) through the head's ``id2label``.

    Raises :class:`BadInput` for a model without a head, or names that do not match one to one.
    """
    names = model.class_names
    if names is None:
        raise BadInput(
            f"`protocol` head needs a model with a sequence-classification head; '{model.name}' is a "
            f"{model.architecture}; use `protocol` probe, or a model saved with AutoModelForSequenceClassification"
        )
    key = lambda name: str(name).strip().lower()
    columns = {key(name): index for index, name in enumerate(names)}
    if len(columns) != len(names) or sorted(columns) != sorted(map(key, label_names)):
        raise BadInput(
            f"the task's classes ({', '.join(label_names)}) do not match the head's id2label ({', '.join(names)}); "
            "name the task's labels as the head does, or set the model's config id2label"
        )
    return [columns[key(name)] for name in label_names]
