"""`make bench`'s hardware profile names ARM boards and cores (aarch64 kernels print no model name)."""
from benchmarks.hardware import cpu_model


def _cpuinfo(cores: int, part: str, variant: str, features: str, tail: str = "") -> str:
    """/proc/cpuinfo as an aarch64 Linux kernel writes it (one block per core, board lines last on a Pi)."""
    block = ("processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
             "CPU architecture: 8\nCPU variant\t: {variant}\nCPU part\t: {part}\nCPU revision\t: 1\n")
    return "\n".join(block.format(i=i, features=features, variant=variant, part=part) for i in range(cores)) + tail


def test_raspberry_pi_4_is_four_a72_cores_without_dotprod() -> None:
    text = _cpuinfo(4, "0xd08", "0x0", "fp asimd evtstrm crc32 cpuid",
                    "\nRevision\t: c03111\nSerial\t\t: 100000002a3b4c5d\nModel\t\t: Raspberry Pi 4 Model B Rev 1.1\n")
    assert cpu_model(text) == "Raspberry Pi 4 Model B Rev 1.1: 4x Cortex-A72 (no dotprod/fp16/i8mm)"


def test_raspberry_pi_5_has_dotprod_and_fp16() -> None:
    features = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                "asimddp")
    text = _cpuinfo(4, "0xd0b", "0x4", features, "\nRevision\t: c04170\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
    assert cpu_model(text) == "Raspberry Pi 5 Model B Rev 1.0: 4x Cortex-A76 (asimddp asimdhp)"


def test_jetson_orin_board_comes_from_the_device_tree() -> None:
    features = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                "asimddp uscat ilrcpc flagm paca pacg")
    model = cpu_model(_cpuinfo(6, "0xd42", "0x0", features), board="NVIDIA Jetson Orin Nano Developer Kit")
    assert model == "NVIDIA Jetson Orin Nano Developer Kit: 6x Cortex-A78AE (asimddp asimdhp)"


def test_big_little_cores_are_listed_by_kind() -> None:
    little, big = _cpuinfo(2, "0xd05", "0x2", "fp asimd asimddp"), _cpuinfo(2, "0xd0b", "0x4", "fp asimd asimddp")
    assert cpu_model(little + "\n" + big) == "2x Cortex-A55 + 2x Cortex-A76 (asimddp)"


def test_x86_keeps_the_model_name() -> None:
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu\n"
    assert cpu_model(text) == "Intel(R) Xeon(R) Platinum 8488C"
