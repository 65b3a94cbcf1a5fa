"""Callbacks for training frameworks a script already uses: they report progress to carbonflow, stop when
profiling has measured enough, and save the model where carbonflow registers it.

* :class:`carbonflow.integrations.huggingface.CarbonflowTrainerCallback` — Hugging Face ``Trainer``
  (extra ``carbonflow[hf]``);
* :class:`carbonflow.integrations.lightning.CarbonflowLightningCallback` — PyTorch Lightning
  (extra ``carbonflow[lightning]``).

Each is imported from its own module so that neither framework is needed by the other.
"""
