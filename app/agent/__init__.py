"""The reference GPU agent (``arona agent``): connects to the panel's ``/ws/agent``,
reports its GPUs, and runs model servers on command."""
