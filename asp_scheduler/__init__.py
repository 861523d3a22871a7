"""Offline ASP scheduler: length prediction -> DP minibatches -> SA-balanced batch groups.

numpy + numba only; importing this package never imports torch.
"""

from asp_scheduler.calibration import IsotonicCalibrator
from asp_scheduler.metrics import ScheduleMetrics, schedule_metrics
from asp_scheduler.minibatch import MinibatchPartition, partition_sorted
from asp_scheduler.ordering import OrderingResult, anneal_order
from asp_scheduler.params import ScheduleParams
from asp_scheduler.schedule import Schedule, build_schedule

__all__ = [
    "IsotonicCalibrator",
    "MinibatchPartition",
    "OrderingResult",
    "Schedule",
    "ScheduleMetrics",
    "ScheduleParams",
    "anneal_order",
    "build_schedule",
    "partition_sorted",
    "schedule_metrics",
]
