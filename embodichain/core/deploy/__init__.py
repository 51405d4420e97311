"""Deploying a trained policy (design R-DEPLOY-1): a checkpoint's deployable forward exported
as one self-contained artifact (ONNX or torch.export `.pt2`) carrying its interface and
provenance, checked against the checkpoint before it is published."""
