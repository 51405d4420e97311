"""Running an exported policy without the framework (`runner.py`: numpy + onnxruntime, or
torch for a `.pt2`). Nothing here imports torch or embodichain at import time."""
