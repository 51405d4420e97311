"""What the camera policies share: the image backbone (`backbone.py`)."""
