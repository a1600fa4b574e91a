"""Storage, views and host<->device transfers of ``tpu`` tensors."""
