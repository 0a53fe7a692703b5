"""A stand-in for the pynvml module: an 8-GPU RTX PRO 6000 Blackwell host, configurable."""
from types import SimpleNamespace

GIB = 1024**3


class NVMLError(Exception):
    def __init__(self, value=999, msg="NVML error"):
        super().__init__(msg)
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self):
        super().__init__(3, "Not Supported")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self):
        super().__init__(12, "NVML Shared Library Not Found")


class FakeNVML:
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_P2P_CAPS_INDEX_READ = (0,)   # as nvidia-ml-py really defines it
    NVML_P2P_STATUS_OK = 0

    def __init__(self, n=8, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", total_gib=95.6, ecc=True,
                 persistence=True, mig=False, procs=None, cc=(12, 0), p2p_ok=True, temp=45, no_driver=False, cuda=13000):
        self.n, self.name, self.total, self.ecc, self.pers, self.mig = n, name, int(total_gib * GIB), ecc, persistence, mig
        self.procs = procs or {}
        self.cc, self.p2p_ok, self.temp, self.no_driver, self.cuda = cc, p2p_ok, temp, no_driver, cuda
        self.shutdown_called = False

    def nvmlInit(self):
        if self.no_driver:
            raise NVMLError_LibraryNotFound()

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.name

    def nvmlDeviceGetMemoryInfo(self, h):
        used = sum(p for p in self.procs.get(h, {}).values())
        return SimpleNamespace(total=self.total, free=self.total - used, used=used)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.cc

    def nvmlDeviceGetEccMode(self, h):
        if self.ecc is None:
            raise NVMLError_NotSupported()
        return (int(self.ecc), int(self.ecc))

    def nvmlDeviceGetPersistenceMode(self, h):
        return int(self.pers)

    def nvmlDeviceGetMigMode(self, h):
        return (int(self.mig), int(self.mig))

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.temp

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 2400

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 2617

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in self.procs.get(h, {}).items()]

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 30 if (a < 4) == (b < 4) else 50

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        assert isinstance(idx, int), "the 1-tuple constant must be unwrapped"
        return 0 if self.p2p_ok else 2
