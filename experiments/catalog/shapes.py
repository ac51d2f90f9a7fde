"""Semantic segmentation of generated shapes with a small U-Net."""

from estimator_keras import sources
from estimator_keras.engines.keras_setup import keras_api
from experiments.catalog import models
from experiments.catalog.registry import register, register_dataset
from experiments.config.types import DataConfig, Experiment, ExperimentConfig, TrainConfig


def _splits(source_dir=None, download_dir=None, num_train=8000, num_test=1000):
    del source_dir, download_dir  # generated
    # Different seeds keep test images out of the training set.
    found = {"train": sources.ShapesSource(num_train, image_size=64, seed=0),
             "test": sources.ShapesSource(num_test, image_size=64, seed=1)}
    for source in found.values():
        source.labels = {"mask": {"num_classes": len(sources.SHAPES_CLASSES),
                                  "class_names": list(sources.SHAPES_CLASSES)}}
    return found


register_dataset("shapes", "generated 64x64 RGB shapes with per-pixel class masks, 8k/1k",
                 _splits)


def segmentation_metrics(data=None):
    """Pixel accuracy and mean IoU over the mask's classes."""
    keras = keras_api()  # when called: list needs no Keras
    classes = data.num_classes if data is not None and data.num_classes else len(
        sources.SHAPES_CLASSES)
    return [keras.metrics.SparseCategoricalAccuracy(name="pixel_accuracy"),
            keras.metrics.MeanIoU(classes, sparse_y_pred=False, name="mean_iou")]


UNET = register(Experiment(
    config=ExperimentConfig(
        name="shapes_unet",
        description="Small U-Net segmenting generated circles/rectangles/triangles "
                    "(pixel accuracy, mean IoU)",
        data=DataConfig(dataset="shapes", label="mask"),
        train=TrainConfig(batch_size=32, max_steps=3000, eval_every_steps=1000,
                          learning_rate=2e-3),
        model={"filters": 16, "depth": 3, "num_classes": 0},
        best_metric="mean_iou"),
    build_model=models.unet,
    metrics=segmentation_metrics))
