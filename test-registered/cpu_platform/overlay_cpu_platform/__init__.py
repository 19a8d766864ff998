"""A test-only SGLang platform: SGLang's real scheduler on a machine without a GPU.

Registered under SGLang's platform entry-point group (``sglang.srt.platforms``, name
``overlay_cpu``) and selected explicitly by the tests with ``SGLANG_PLATFORM=overlay_cpu``,
so nothing else ever picks it up. It is installed into the SGLang test environments only
(``scripts/sglang_envs.py``), never into the project's wheel.

``activate()`` only names the class: SGLang imports ``overlay_cpu_platform.srt_platform`` when it
resolves its platform, in every process that needs one.
"""

PLATFORM_NAME = "overlay_cpu"


def activate() -> str:
    """SGLang's platform plugin protocol: the class path of the platform."""
    return "overlay_cpu_platform.srt_platform.OverlayCpuPlatform"
