"""Semantic segmentation of generated shapes with a small U-Net."""

from estimator_keras import sources
from experiments import models
from experiments.config import DataConfig, Experiment, ExperimentConfig, TrainConfig
from experiments.registry import register, register_dataset

NUM_CLASSES = 4  # background, circle, rectangle, triangle


def _splits(source_dir=None, download_dir=None, num_train=8000, num_test=1000):
    del source_dir, download_dir  # generated
    # Different seeds keep test images out of the training set.
    return {"train": sources.ShapesSource(num_train, image_size=64, seed=0),
            "test": sources.ShapesSource(num_test, image_size=64, seed=1)}


register_dataset("shapes", "generated 64x64 RGB shapes with per-pixel class masks, 8k/1k",
                 _splits)


def _metrics():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (list needs no TF)
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
