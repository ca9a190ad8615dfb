"""QIO's other two USQCD KS propagator file types (qio/include/qioxml_usqcd_ksprop.h; MILC's FILE_TYPE_KS_USQCD_VV_PAIRS
and _CV_PAIRS): source-sink pairs with colour-vector or scalar sources. Round trips in F and D, the whole file byte
for byte against a layout built here from the QIO and MILC descriptions, and the one-line refusals between the
three-colour and the pairs readers."""
from __future__ import annotations

import numpy as np
import pytest

from lattice.io import GaugeFileError, read_ksprop, read_ksprop_pairs, write_ksprop, write_ksprop_pairs
from lattice.io.scidac import xml_fields
from tests.lattice.test_io import one_line_error
from tests.lattice.test_io_qio_fields import SHAPE, field, records, spec_binary_and_checksum, spec_lime
from tests.lattice.test_io_qio_hypercube import spec_record, z

N = 2                                        # pairs


@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("precision", [32, 64])
def test_pairs_round_trip_bitwise(tmp_path, vector, precision):
    single = precision == 32
    sources = field((N,) + SHAPE + ((3,) if vector else ()), seed=2, single=single)
    solutions = field((N,) + SHAPE + (3,), seed=3, single=single)
    p = tmp_path / "pairs.ksprop"
    sums = write_ksprop_pairs(p, sources, solutions, precision, info="i")
    src, sol, info = read_ksprop_pairs(p)
    assert np.array_equal(src, sources) and np.array_equal(sol, solutions)
    assert info["type"] == ("USQCD_ColorVector_Source_Sink_Pairs" if vector else
                            "USQCD_ColorVector_ScalarSource_Sink_Pairs")
    assert [f["checksums"]["computed"] for f in info["fields"]] == [s for pair in zip(sums["sources"],
                                                                                       sums["solutions"]) for s in pair]
    assert [f["record_xml"].get("color") for f in info["fields"][1::2]] == [str(k) for k in range(N)]


def test_pairs_file_matches_the_layout_of_the_description(tmp_path):
    """Colour-vector sources on the whole lattice and scalar sources on time slice 1 (a hypercube record), each
    followed by its solution, byte for byte as built from the descriptions (dates taken from the file)."""
    for vector in (True, False):
        sources = field((N,) + SHAPE + ((3,) if vector else ()), seed=2)
        solutions = field((N,) + SHAPE + (3,), seed=3)
        p = tmp_path / f"pairs{vector}.ksprop"
        write_ksprop_pairs(p, sources, solutions, 64, info="i", source_info="s", record_info="r",
                           source_slice=None if vector else 1)
        dates = [xml_fields(d)["date"] for t, d in records(p) if t == "scidac-private-record-xml"]
        kind = "USQCD_ColorVector_Source_Sink_Pairs" if vector else "USQCD_ColorVector_ScalarSource_Sink_Pairs"
        messages = [[("scidac-private-file-xml", z("<scidacFile><version>1.1</version><spacetime>4</spacetime>"
                                                   "<dims>4 6 2 4 </dims><volfmt>0</volfmt></scidacFile>")),
                     ("scidac-file-xml", z(f"<usqcdKSPropFile><version>1.0</version><type>{kind}</type><info>i</info>"
                                           "</usqcdKSPropFile>"))]]
        source_xml = "<usqcdSourceInfo><version>1.0</version><info>s</info></usqcdSourceInfo>"
        for k in range(N):
            if vector:
                messages.append(whole_record(sources[k][..., None, :], "QDP_D3_ColorVector", 3, 48, source_xml,
                                             dates[2 * k]))
            else:
                messages.append(spec_record(sources[k][..., None], (0, 0, 0, 1), (3, 5, 1, 1), "QDP_D_Complex", 0, 16,
                                            source_xml, dates[2 * k]))
            messages.append(whole_record(solutions[k][..., None, :], "QDP_D3_ColorVector", 3, 48,
                                         f"<usqcdKSPropInfo><version>1.0</version><color>{k}</color><info>r</info>"
                                         "</usqcdKSPropInfo>", dates[2 * k + 1]))
        assert p.read_bytes() == spec_lime(messages), vector


def whole_record(values, datatype, colors, typesize, record_xml, date):
    """A field on the whole lattice (recordtype 0, written with the 1.0 record format as MILC's files)."""
    binary, suma, sumb = spec_binary_and_checksum(values, 8)
    return [("scidac-private-record-xml", z(f"<scidacRecord><version>1.0</version><date>{date}</date>"
                                            f"<globaldata>0</globaldata><datatype>{datatype}</datatype>"
                                            f"<precision>D</precision><colors>{colors}</colors>"
                                            f"<typesize>{typesize}</typesize><datacount>1</datacount>"
                                            "</scidacRecord>")),
            ("scidac-record-xml", z(record_xml)), ("scidac-binary-data", binary),
            ("scidac-checksum", z(f"<scidacChecksum><version>1.0</version><suma>{suma:x}</suma><sumb>{sumb:x}</sumb>"
                                  "</scidacChecksum>"))]


def test_each_reader_refuses_the_other_type_in_one_line(tmp_path):
    pairs, three = tmp_path / "pairs.ksprop", tmp_path / "three.ksprop"
    write_ksprop_pairs(pairs, field((N,) + SHAPE), field((N,) + SHAPE + (3,)))
    write_ksprop(three, field((3,) + SHAPE + (3,)))
    with pytest.raises(GaugeFileError) as e:
        read_ksprop(pairs)
    assert "read_ksprop_pairs" in one_line_error(e, pairs)
    with pytest.raises(GaugeFileError) as e:
        read_ksprop_pairs(three)
    assert "not a USQCD KS propagator of source-sink pairs" in one_line_error(e, three)
    with pytest.raises(GaugeFileError) as e:
        write_ksprop_pairs(tmp_path / "bad.ksprop", field((N,) + SHAPE + (2,)), field((N,) + SHAPE + (3,)))
    assert "one per solution" in one_line_error(e, tmp_path / "bad.ksprop")
