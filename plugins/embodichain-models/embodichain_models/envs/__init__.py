"""Gymnasium environments of the model recipes, for closed-loop evaluation (R-EVAL-1).
Each module registers its ids when imported (a recipe's `evaluation.env.import`)."""
