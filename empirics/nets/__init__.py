"""Networks: the model kinds and their feature strategies, the paper's networks, the named training protocols,
training one network and many at once (the stacked engine), the losses they train on, and the attacks that
adversarial training and the flip experiments perturb inputs with."""
