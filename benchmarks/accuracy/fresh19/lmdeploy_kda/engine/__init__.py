# Copyright (c) OpenMMLab. All rights reserved.
