"""mclib: the library behind the book "Abrupt Learning in Transformers: matrix completion".

Where things are:
    config.py   profiles (params/*.yaml) as typed dataclasses, validated
    data.py     low-rank matrices, masks, the tokenizer
    model.py    BertModel + linear read-out, checkpoints via from_pretrained
    metrics.py  L, L_obs, L_mask, mask value; `find_drop`, the definition of the drop
    train.py    online training with atomic checkpoints and exact resume
    plots.py    figures
"""
