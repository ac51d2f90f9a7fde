"""Semantic segmentation of generated shapes with a small U-Net."""

from experiments import models
from experiments.registry import DataConfig, Experiment, ExperimentConfig, TrainConfig, register

NUM_CLASSES = 4  # background, circle, rectangle, triangle


def _metrics():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return [tf.keras.metrics.SparseCategoricalAccuracy(name="pixel_accuracy"),
            tf.keras.metrics.MeanIoU(NUM_CLASSES, sparse_y_pred=False, name="mean_iou")]


UNET = register(Experiment(
    config=ExperimentConfig(
        name="shapes_unet",
        description="Small U-Net segmenting generated circles/rectangles/triangles "
                    "(pixel accuracy, mean IoU)",
        data=DataConfig(dataset="shapes", label="mask"),
        train=TrainConfig(batch_size=32, max_steps=3000, eval_every_steps=1000,
                          learning_rate=2e-3),
        model={"filters": 16},
        best_metric="mean_iou"),
    build_model=lambda hp: models.small_unet(hp, num_classes=NUM_CLASSES),
    metrics=_metrics))
