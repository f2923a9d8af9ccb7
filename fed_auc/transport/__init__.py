"""How requests reach nodes: in-process (``local``) and over Flower (``flower``). A
transport only moves requests and replies; it never imports the simulation."""
