"""Diffusion Policy (Chi et al. 2023), its CNN variant, on the ALOHA benchmark: a 1-D
convolutional U-Net over the action horizon, conditioned on the last observations, trained
to predict DDPM noise and sampled with DDIM. Factory `aloha_diffusion` (`sl_recipe.py`)."""
