"""Cart-pole from pixels: a small CNN estimates the cart-pole's state from rendered frames
read lazily from an HDF5 file (`prepare.py` writes it, `sl_recipe.py` trains on it)."""
