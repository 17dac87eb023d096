"""Fleet's quick start ``nets.py``: the MLP (two tanh layers of 128, a softmax of
2, the mean cross entropy), as a torch module whose forward returns the cost."""

import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, hid_dim=128, label_dim=2):
        super().__init__()
        self.fc_1 = nn.Linear(32, hid_dim)
        self.fc_2 = nn.Linear(hid_dim, hid_dim)
        self.prediction = nn.Linear(hid_dim, label_dim)

    def forward(self, input_x, input_y):
        fc_1 = self.fc_1(input_x).tanh()
        fc_2 = self.fc_2(fc_1).tanh()
        return F.cross_entropy(self.prediction(fc_2), input_y)  # softmax, then the mean cost
