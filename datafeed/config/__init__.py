"""What a dataset is told: its settings, its slots and the errors it raises.

In: the user's ``init(...)`` keywords, ``Slot``s or Paddle-style variables, slot
specs as text. Out: validated ``Settings`` and a ``SlotSchema`` that every later
stage reads; the exception classes every stage raises. Imports no other stage.
"""
