"""The original API's module name for the reward transforms: `import unstable.reward_transformations as retra`."""

from unstable.rewards import *  # noqa: F401,F403
from unstable.rewards import __all__  # noqa: F401
