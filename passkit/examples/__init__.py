"""Small models shipped with passkit: those ``passkit run`` uses with no arguments (``transformer``,
``convnet``), a small SimpleFSDP (``simple_fsdp``), and a top-1 MoE block (``moe``) whose routing
makes data-dependent sizes."""
