"""The scaling group: a scaling-law ladder that predicts a training stage's loss before it trains.

    scaling/ladder   ladder.py    one proxy run per model size and token budget (partitioned)
    scaling/fit      fit.py       L(N, D) = E + A/N^alpha + B/D^beta fitted to the rungs; the largest size and budget held out
    (shared)         section.py   the recipe's `scaling` section, keys, rungs, how N, D, C and the loss are counted
    (stages)         predict.py   a training stage's predicted loss, read from the latest fit (not a dependency)

Nothing is imported here: section.py imports the recipe's scaling section (assets/recipe/scaling.py), and
ladder.py and fit.py import the recipe.
"""
